-- Extend our handler lease while the handler runs (only ours: one taken over is left alone).
-- KEYS[1] = lease key; ARGV[1] = lease token, ARGV[2] = lease ms
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
