-- Claim a message for processing, in one round trip; first mark earlier messages done (the done
-- markers a claim carries: finish.lua's work for each, so their answers need no reads of their own).
-- KEYS[1] = done key, KEYS[2] = lease key; ARGV[1] = lease token, ARGV[2] = lease ms.
-- Carried markers, each a pair after those: KEYS = its done key and lease key, ARGV = its lease
-- token and done TTL ms.
-- Returns 1 = already done (duplicate), 2 = someone else holds the lease (busy), 0 = claimed;
-- with markers carried, {that answer, markers that failed, the first failure's error or ''}.
local failed, first = 0, ''
for i = 3, #KEYS, 2 do
  -- a marker's error (e.g. WRONGTYPE) is its own: the others and the claim still run
  local set = redis.pcall('SET', KEYS[i], '1', 'PX', ARGV[i + 1])
  local held = set
  if not (type(set) == 'table' and set.err) then
    held = redis.pcall('GET', KEYS[i + 1])
  end
  if type(held) == 'table' and held.err then
    failed = failed + 1
    if first == '' then first = held.err end
  elseif held == ARGV[i] then
    redis.call('DEL', KEYS[i + 1])
  end
end
local answer
if redis.call('EXISTS', KEYS[1]) == 1 then
  answer = 1
elseif redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  answer = 0
elseif redis.call('GET', KEYS[2]) == ARGV[1] then
  answer = 0
else
  answer = 2
end
if #KEYS == 2 then
  return answer
end
return {answer, failed, first}
