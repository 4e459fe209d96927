/* ib.h — what the rest of libcoll sees of the InfiniBand verbs transport (ib.c, built
 * only when libibverbs is found: COLL_HAVE_IBVERBS in coll_config.h).
 *
 * Must never be included by code compiled without COLL_HAVE_IBVERBS, and exposes no
 * verbs type, so callers need no verbs header.
 */
#ifndef COLL_IB_H
#define COLL_IB_H

#include <stdbool.h>
#include <stddef.h>

#include "transport.h"

extern const coll_transport coll_transport_ib;

/* True when this process can use an HCA port (COLL_IB_HCA honoured).  Looks once per
 * process and says what it found once at INFO level; on false, `why` gets a sentence
 * naming what is missing ("no InfiniBand device: ibv_get_device_list returned 0
 * devices"). */
bool coll_ib_probe(char *why, size_t why_len);

#endif
