package payments

// LockNamespace is the first key of every advisory lock pitlane takes:
// pg_advisory_xact_lock(namespace int4, hashtext(id)). This is the one list of namespaces; the
// console decodes pg_locks (classid = namespace, objid = hashtext(id)) with it.
//
// Only transaction-scoped advisory locks are used (the *_xact_* functions), always after
// `SET LOCAL lock_timeout`, so they vanish with the transaction, never outlive a crashed request,
// and work through pgbouncer in transaction mode. No lock is ever held across a gateway call.
type LockNamespace int32

const (
	// LockCreateOrder serialises the Claim step of Create for one order id: read the active
	// session, decide, insert — as one critical section per order, across replicas.
	LockCreateOrder LockNamespace = 1001
	// LockIdempotencyKey serialises acquisition of one API idempotency key (client, key).
	LockIdempotencyKey LockNamespace = 1002
	// LockIntentKey serialises acquisition of one derived business-intent key.
	LockIntentKey LockNamespace = 1003
	// LockCodeContact serialises the count of one-time codes sent to one customer contact
	// (lower case) with the new one, across its payments (Config.CodeRequestsPerContact).
	LockCodeContact LockNamespace = 1004
	// LockOpsSample serialises the Operations page's samples (SampleOps), one key for all.
	LockOpsSample LockNamespace = 1005
	// LockGatewayRefund serialises the applies of refund answers naming one gateway refund
	// (gateway and refund id), across payments: each reads whether another refund holds it
	// (refundAnswerAbout) and, under their own payments' locks alone, two applies both found
	// none and booked one gateway refund twice (a review).
	LockGatewayRefund LockNamespace = 1006
	// LockStaffEmails serialises the creation of staff users, one key for all: each compares
	// its email's look (a confusable skeleton, access.CreateUser) with every account's, and two
	// look-alikes created at once must not both find none.
	LockStaffEmails LockNamespace = 1007
)

// LockNamespaceNames names each namespace for people (console, docs).
var LockNamespaceNames = map[LockNamespace]string{
	LockCreateOrder:    "create-order",
	LockIdempotencyKey: "idempotency-key",
	LockIntentKey:      "intent-key",
	LockCodeContact:    "code-contact",
	LockOpsSample:      "ops-sample",
	LockGatewayRefund:  "gateway-refund",
	LockStaffEmails:    "staff-emails",
}
