/*
 * loopback_bind.so: an LD_PRELOAD shim that turns a bind() to the wildcard address into a bind
 * to loopback (0.0.0.0 -> 127.0.0.1, :: -> ::1), so servers without a bind-address setting
 * listen on loopback only. RocketMQ 4.9.x is one: its name server and broker bind their ports on
 * every interface (`bindAddress` arrived in 5.x). scripts/rocketmq.sh builds this with gcc into
 * its cache and starts both JVMs with it; every other bind() passes through untouched.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  static bind_fn real_bind;
  if (!real_bind) {
    real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
  }
  if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    struct sockaddr_in in;
    memcpy(&in, addr, sizeof in);
    if (in.sin_addr.s_addr == htonl(INADDR_ANY)) {
      in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      return real_bind(fd, (const struct sockaddr *)&in, sizeof in);
    }
  }
  if (addr && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 in6;
    memcpy(&in6, addr, sizeof in6);
    if (memcmp(&in6.sin6_addr, &in6addr_any, sizeof in6addr_any) == 0) {
      in6.sin6_addr = in6addr_loopback;
      return real_bind(fd, (const struct sockaddr *)&in6, sizeof in6);
    }
  }
  return real_bind(fd, addr, len);
}
