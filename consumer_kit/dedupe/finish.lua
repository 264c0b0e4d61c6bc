-- Mark a message done (with a TTL) and drop our lease, atomically.
-- KEYS[1] = done key, KEYS[2] = lease key; ARGV[1] = lease token, ARGV[2] = done TTL ms
redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
return 1
