package gatewaysim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// The simulator keeps its payments in memory. `pitlane dev` keeps its database across restarts,
// so a simulator that forgot its payments on every restart left the demo's sessions pointing at
// payments nobody knew (hosted-page links 404, the patrol and reconciliation flagging every one
// for finance). SaveState and LoadState carry what a real gateway would keep across a restart:
// payments, refunds and finished idempotency keys. Faults, pauses, call counts and queued
// webhooks are the run's, not the gateway's, and start afresh.

const stateVersion = 1

type stateFile struct {
	Version  int            `json:"version"`
	Seq      int64          `json:"seq"`
	Payments []statePayment `json:"payments"`
	Refunds  []Refund       `json:"refunds"`
	Keys     []stateKey     `json:"keys"`
}

type statePayment struct {
	Payment
	Seq          int64     `json:"seq"`
	AuthorizedAt time.Time `json:"authorized_at"`
}

type stateKey struct {
	Key         string `json:"key"`
	Fingerprint string `json:"fingerprint"`
	ResourceID  string `json:"resource_id"`
}

// SaveState writes the simulator's payments, refunds and finished idempotency keys to path
// (a temporary file renamed over it: a crash mid-write leaves the previous state).
func (s *Sim) SaveState(path string) error {
	s.mu.Lock()
	st := stateFile{Version: stateVersion, Seq: s.seq}
	for _, p := range s.payments {
		st.Payments = append(st.Payments, statePayment{Payment: p.Payment, Seq: p.seq, AuthorizedAt: p.authorizedAt})
	}
	for _, r := range s.refunds {
		st.Refunds = append(st.Refunds, *r)
	}
	for k, rec := range s.keys {
		if rec.done { // a key still being processed is the dying run's: its call got no answer
			st.Keys = append(st.Keys, stateKey{Key: k, Fingerprint: rec.fingerprint, ResourceID: rec.resourceID})
		}
	}
	s.mu.Unlock()
	sort.Slice(st.Payments, func(i, j int) bool { return st.Payments[i].Seq < st.Payments[j].Seq })
	sort.Slice(st.Refunds, func(i, j int) bool { return st.Refunds[i].ID < st.Refunds[j].ID })
	sort.Slice(st.Keys, func(i, j int) bool { return st.Keys[i].Key < st.Keys[j].Key })
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("gatewaysim: save state: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("gatewaysim: save state: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("gatewaysim: save state: %w", err)
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename
	if _, err := tmp.Write(b); err != nil {
		tmp.Close() //nolint:errcheck,gosec // the write failed already
		return fmt.Errorf("gatewaysim: save state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("gatewaysim: save state: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("gatewaysim: save state: %w", err)
	}
	return nil
}

// LoadState replaces the simulator's payments, refunds and idempotency keys with those saved
// at path. A missing file is an empty state (the first start), not an error. Call it before
// the simulator serves.
func (s *Sim) LoadState(path string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("gatewaysim: load state: %w", err)
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("gatewaysim: load state %s: %w", path, err)
	}
	if st.Version != stateVersion {
		return fmt.Errorf("gatewaysim: load state %s: version %d, this simulator reads %d", path, st.Version, stateVersion)
	}
	sort.Slice(st.Payments, func(i, j int) bool { return st.Payments[i].Seq < st.Payments[j].Seq })
	s.mu.Lock()
	defer s.mu.Unlock()
	s.payments = make(map[string]*payment, len(st.Payments))
	s.byRef = map[string][]*payment{}
	s.refunds = make(map[string]*Refund, len(st.Refunds))
	s.keys = make(map[string]*idemRecord, len(st.Keys))
	s.seq = st.Seq
	for _, sp := range st.Payments {
		p := &payment{Payment: sp.Payment, seq: sp.Seq, authorizedAt: sp.AuthorizedAt}
		s.payments[p.ID] = p
		s.byRef[p.Reference] = append(s.byRef[p.Reference], p) // in creation order, as registered
		s.seq = max(s.seq, p.seq)
	}
	for _, r := range st.Refunds {
		s.refunds[r.ID] = &r
	}
	for _, k := range st.Keys {
		s.keys[k.Key] = &idemRecord{fingerprint: k.Fingerprint, done: true, resourceID: k.ResourceID}
	}
	return nil
}
