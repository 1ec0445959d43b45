// Package e2e holds no code, only proofs: the locking core (payments.Service) with the real
// reference-gateway client (refgw) against the real simulator (gatewaysim) over HTTP, and the
// simulator's signed webhooks into the real router. Where the core's own tests use a fake gateway
// in-process, these show the same guarantees survive the wire: a lost answer, a 5xx before
// processing, a gateway that ignores idempotency keys, duplicated and reordered webhooks.
package e2e
