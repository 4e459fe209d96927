/* init_env.c — coll_comm_init_from_env: join the job the launcher describes.
 *
 * Rank and size come from whichever launcher started us (first found wins):
 *   COLL_RANK / COLL_WORLD_SIZE                          (our own local launcher)
 *   RANK / WORLD_SIZE                                    (torchrun)
 *   OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE          (Open MPI's mpirun)
 *   PMI_RANK / PMI_SIZE                                  (MPICH's hydra, PMI)
 *   SLURM_PROCID / SLURM_NTASKS                          (srun)
 * The rendezvous is COLL_ADDR=host:port, else MASTER_ADDR + MASTER_PORT; rank 0 listens
 * there and everyone (rank 0 too) connects to it.
 *
 * The job's secret cannot travel in an id here, so it is COLL_SECRET when set, else a
 * hash of the rendezvous address, the size and the launcher's job id.  That keeps two
 * jobs on one port apart but is not a defence against a hostile host on the network:
 * set COLL_SECRET (the same random string on every rank) for that.
 * Must never guess silently: a missing or malformed variable is an error that says
 * which variables were looked for.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "internal.h"

static const char *rank_vars[][2] = {
    {"COLL_RANK", "COLL_WORLD_SIZE"},
    {"RANK", "WORLD_SIZE"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"PMI_RANK", "PMI_SIZE"},
    {"SLURM_PROCID", "SLURM_NTASKS"},
};

static bool parse_int(const char *s, long *out) {
  if (!s || !*s) return false;
  char *end;
  long v = strtol(s, &end, 10);
  if (*end) return false;
  *out = v;
  return true;
}

/* "localhost", or a name under ".localhost" (RFC 6761), in any case. */
static bool is_localhost(const char *host) {
  size_t n = strlen(host);
  if (n && host[n - 1] == '.') n--; /* the absolute form, "localhost." */
  static const char name[] = "localhost";
  size_t k = sizeof name - 1;
  return n >= k && strncasecmp(host + n - k, name, k) == 0 && (n == k || host[n - k - 1] == '.');
}

static uint64_t fnv(uint64_t h, const char *s) {
  for (; s && *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

void coll_env_secret(uint8_t out[COLL_SECRET_BYTES], const char *addr, long size) {
  const char *job_vars[] = {"COLL_SECRET",
                            "SLURM_JOB_ID",
                            "SLURM_STEP_ID",
                            "OMPI_MCA_ess_base_jobid",
                            "OMPI_MCA_orte_ess_jobid",
                            "TORCHELASTIC_RUN_ID",
                            "PMI_ID",
                            "PMIX_NAMESPACE"};
  char sz[32];
  snprintf(sz, sizeof sz, "%ld", size);
  uint64_t h1 = fnv(1469598103934665603ull, "libcoll-env-secret"), h2 = fnv(h1, "second half");
  const char *sec = getenv("COLL_SECRET");
  if (sec && *sec) {
    h1 = fnv(h1, sec);
    h2 = fnv(h2, sec);
  } else {
    h1 = fnv(fnv(h1, addr), sz);
    h2 = fnv(fnv(h2, sz), addr);
    for (size_t i = 1; i < sizeof job_vars / sizeof *job_vars; i++) {
      h1 = fnv(h1, getenv(job_vars[i]));
      h2 = fnv(h2, getenv(job_vars[i]));
    }
  }
  memcpy(out, &h1, 8);
  memcpy(out + 8, &h2, 8);
}

coll_result coll_env_job(coll_id_fields *fp, int *rankp, int *sizep) {
  long rank = -1, size = -1;
  const char *from = NULL;
  for (size_t i = 0; i < sizeof rank_vars / sizeof *rank_vars; i++) {
    const char *r = getenv(rank_vars[i][0]), *s = getenv(rank_vars[i][1]);
    if (!r && !s) continue;
    if (!parse_int(r, &rank) || !parse_int(s, &size))
      return coll_fail(NULL, COLL_ERR_INVALID_ARG,
                       "coll_comm_init_from_env: %s=%s and %s=%s must both be integers",
                       rank_vars[i][0], r ? r : "(unset)", rank_vars[i][1], s ? s : "(unset)");
    from = rank_vars[i][0];
    break;
  }
  if (!from)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG,
                     "coll_comm_init_from_env: no launcher found: set RANK and WORLD_SIZE (or "
                     "run under torchrun, mpirun, srun, or use --ranks N)");
  if (size < 1 || rank < 0 || rank >= size)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG,
                     "coll_comm_init_from_env: rank %ld of %ld (from %s) is impossible", rank, size,
                     from);

  char host[256], addrdesc[300];
  const char *port = NULL;
  const char *ca = getenv("COLL_ADDR");
  if (ca && *ca) {
    snprintf(host, sizeof host, "%s", ca);
    char *colon = strrchr(host, ':');
    if (!colon) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "COLL_ADDR=%s must be host:port", ca);
    *colon = 0;
    port = colon + 1;
    if (host[0] == '[') { /* [v6]:port */
      memmove(host, host + 1, strlen(host));
      char *rb = strchr(host, ']');
      if (rb) *rb = 0;
    }
  } else {
    const char *ma = getenv("MASTER_ADDR"), *mp = getenv("MASTER_PORT");
    if (!ma || !*ma || !mp || !*mp)
      return coll_fail(NULL, COLL_ERR_INVALID_ARG,
                       "coll_comm_init_from_env: no rendezvous address: set COLL_ADDR=host:port "
                       "(or MASTER_ADDR and MASTER_PORT)");
    snprintf(host, sizeof host, "%s", ma);
    port = mp;
  }
  long portnum;
  if (!parse_int(port, &portnum) || portnum < 1 || portnum > 65535)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG, "rendezvous port '%s' is not a port number", port);
  snprintf(addrdesc, sizeof addrdesc, "%s:%ld", host, portnum);

  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  int e = getaddrinfo(host, NULL, &hints, &res);
  if ((e != 0 || !res) && is_localhost(host)) {
    /* "localhost" is the loopback address whatever the resolver says (RFC 6761 6.3): a
     * container or chroot without /etc/hosts cannot resolve it, yet MASTER_ADDR=localhost
     * is what torchrun-style launches on one machine set. */
    hints.ai_flags = AI_NUMERICHOST;
    e = getaddrinfo("127.0.0.1", NULL, &hints, &res);
  }
  if (e != 0 || !res)
    return coll_fail(NULL, COLL_ERR_INVALID_ARG, "cannot resolve rendezvous host '%s': %s", host,
                     gai_strerror(e));
  coll_id_fields f = {.port = (uint16_t)portnum};
  struct addrinfo *pick = res;
  for (struct addrinfo *a = res; a; a = a->ai_next)
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  f.family = (uint16_t)pick->ai_family;
  if (pick->ai_family == AF_INET)
    memcpy(f.addr, &((struct sockaddr_in *)pick->ai_addr)->sin_addr, 4);
  else
    memcpy(f.addr, &((struct sockaddr_in6 *)pick->ai_addr)->sin6_addr, 16);
  freeaddrinfo(res);
  coll_env_secret(f.secret, addrdesc, size);

  COLL_INFO((int)rank, "init from env (%s): rank %ld of %ld, rendezvous %s", from, rank, size,
            addrdesc);
  *fp = f;
  *rankp = (int)rank;
  *sizep = (int)size;
  return COLL_OK;
}

coll_result coll_comm_init_from_env(coll_comm_t *comm) {
  if (!comm) return coll_fail(NULL, COLL_ERR_INVALID_ARG, "coll_comm_init_from_env: comm is NULL");
  *comm = NULL;
  coll_id_fields f;
  int rank, size;
  coll_result r = coll_env_job(&f, &rank, &size);
  if (r != COLL_OK) return r;
  if (rank == 0) {
    char why[256];
    r = coll_bootstrap_root_start(&f, false, coll_env_timeout_ms(), why, sizeof why);
    if (r != COLL_OK) return coll_fail(NULL, r, "%s", why);
  }
  return coll_comm_build(comm, size, &f, rank);
}
