-- Claim a message for processing, in one round trip.
-- KEYS[1] = done key, KEYS[2] = lease key; ARGV[1] = lease token, ARGV[2] = lease ms
-- Returns 1 = already done (duplicate), 2 = someone else holds the lease (busy), 0 = claimed.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 1
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 0
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return 0
end
return 2
