package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"

	"pitlane/access"
	"pitlane/payments"
	"pitlane/payments/gateway/fakegw"
)

// What an Idempotency-Key costs a Create (issue 12): one client, Creates of distinct orders one
// after another, each either bare (Service.Create) or through the key protocol
// (Idempotency.Run: acquire the key, Create, complete the key), alternating call by call so a
// burst of load on the machine hits both. The figure is the difference of the medians; target
// under 1 ms. (An API request without a key goes through Run too, with its derived intent key:
// the bare Create is the anchor because it is what a Create costs with no key at all.)
func idempotencyOverhead(ctx context.Context, env *Env) ([]Figure, error) {
	n := env.Size(100, 2000)
	url, err := env.NewDatabase(ctx, true)
	if err != nil {
		return nil, err
	}
	svc, pool, err := coreService(ctx, url, 2, fakegw.New(), nil)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	idem := payments.NewIdempotency(svc, payments.IdempotencyConfig{})
	c, _, err := access.New(pool, nil).CreateAPIClient(ctx, payments.Staff{Email: "bench"}, "bench")
	if err != nil {
		return nil, err
	}
	client := c.ID
	var with, without []time.Duration
	for i := range n + 20 { // the first 20 of each warm the pool and the statement caches
		in := payments.CreateInput{OrderID: fmt.Sprintf("idem-%d", i), Amount: 1000, Currency: "EUR"}
		t := time.Now()
		if _, err := svc.Create(ctx, api, in); err != nil {
			return nil, err
		}
		bare := time.Since(t)
		in.OrderID += "-key"
		path := "/api/v1/orders/" + in.OrderID + "/payments"
		r := payments.IdempotencyRequest{ClientID: client, Kind: payments.IdempotencyClientKey, Key: uuid.NewString(),
			Method: http.MethodPost, Path: path, Fingerprint: payments.Fingerprint(http.MethodPost, path, []byte(`{"amount":1000,"currency":"EUR"}`))}
		t = time.Now()
		if _, err := idem.Run(ctx, r, func(ctx context.Context, _ payments.Slot) (string, int, error) {
			res, err := svc.Create(ctx, api, in)
			return res.Session.ID, http.StatusCreated, err
		}); err != nil {
			return nil, err
		}
		keyed := time.Since(t)
		if i >= 20 {
			without, with = append(without, bare), append(with, keyed)
		}
	}
	p50, anchor := ms(percentile(with, 50)), ms(percentile(without, 50))
	env.Logf("  idempotency: Create p50 %.2f ms with a key, %.2f ms without", p50, anchor)
	return []Figure{{Name: "idempotency key overhead: Create p50 with a key", Value: p50, Unit: "ms",
		Anchor: "Create p50 without a key", AnchorValue: anchor, MaxOverAnchor: bound(1)}}, nil
}
