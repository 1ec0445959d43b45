package main

import (
	"context"
	"slices"
	"sync"
	"time"
)

// loopResult is what a closed loop did: calls completed, how long it ran, each call's latency.
type loopResult struct {
	n       int
	elapsed time.Duration
	lat     []time.Duration
}

func (r loopResult) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.n) / r.elapsed.Seconds()
}

// closedLoop is the load generator of every throughput figure: clients workers, each sending its
// next call when its last one returned (a closed loop: like pgbench's clients, and like the
// figures' "C clients"), for d, or until total calls were made when total > 0. The first error
// stops it. An open-loop generator (vegeta's rate attack) would measure something else: how
// latency grows at a fixed arrival rate, not what C clients get through.
func closedLoop(ctx context.Context, clients int, d time.Duration, total int, op func(ctx context.Context, worker, seq int) error) (loopResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu   sync.Mutex
		all  []time.Duration
		next int
		wg   sync.WaitGroup
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if total > 0 && next >= total {
			return 0, false
		}
		next++
		return next - 1, true
	}
	started := time.Now()
	deadline := started.Add(d)
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			defer func() {
				mu.Lock()
				all = append(all, lat...)
				mu.Unlock()
			}()
			for ctx.Err() == nil && (total > 0 || time.Now().Before(deadline)) {
				seq, ok := take()
				if !ok {
					return
				}
				t := time.Now()
				if err := op(ctx, w, seq); err != nil {
					cancel(err)
					return
				}
				lat = append(lat, time.Since(t))
			}
		}()
	}
	wg.Wait()
	res := loopResult{n: len(all), elapsed: time.Since(started), lat: all}
	if err := context.Cause(ctx); err != nil && ctx.Err() != nil {
		return res, err
	}
	return res, nil
}

// percentile is the p-th percentile (0..100) of lat, nearest rank.
func percentile(lat []time.Duration, p float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
