-- Release our lease (only ours: a lease that expired and was taken over is left alone).
-- KEYS[1] = lease key; ARGV[1] = lease token
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
