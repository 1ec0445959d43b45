package payments

import (
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Scanning a session row (sessionColumns) with scan plans made once per process.
//
// pgx plans the scan of every column again for every query: it memoizes its encode plans, not its
// scan plans, which live on the query's Rows. A click on the hot order is one round trip that
// answers one session, and planning its 17 columns was 40 % of reading the row and 5 % of the
// click's Go CPU (docs/performance.md, the sixth session). The plans here come from pgx itself
// (pgtype.Map.PlanScan), made once from a default type map of our own: pitlane registers no
// types on its connections, so every connection's map plans these columns alike. A ScanPlan
// holds what planning chose and nothing a scan changes, so one set serves every goroutine.
//
// They are used only for a row whose column types and formats are the ones they were made for,
// and only where the row's raw values can be read (pgx.Rows, pgx.CollectableRow); any other row
// (QueryRow's, a batch's, a text-format row through a simple-protocol pooler) is scanned by pgx
// as before.

// rawRow is a row whose field descriptions and raw values can be read.
type rawRow interface {
	FieldDescriptions() []pgconn.FieldDescription
	RawValues() [][]byte
}

// rowPlans are the scan plans of one row shape: its columns' type OIDs and formats, and the
// destination types of the scan that made them.
type rowPlans struct {
	oids    []uint32
	formats []int16
	plans   []pgtype.ScanPlan
}

func (p *rowPlans) fits(fds []pgconn.FieldDescription) bool {
	if len(fds) != len(p.oids) {
		return false
	}
	for i, fd := range fds {
		if fd.DataTypeOID != p.oids[i] || fd.Format != p.formats[i] {
			return false
		}
	}
	return true
}

// planCache keeps the plans of one scan (one row shape, one list of destination types: call
// scan with destinations of the same types every time).
type planCache struct {
	mu    sync.Mutex // one planning at a time
	plans atomic.Pointer[rowPlans]
}

// scan scans row into dst: through the cached plans when the row fits them (made from the
// first row scanned), else through row.Scan.
func (c *planCache) scan(row pgx.Row, dst []any) error {
	r, ok := row.(rawRow)
	if !ok {
		return row.Scan(dst...)
	}
	fds := r.FieldDescriptions()
	p := c.plans.Load()
	if p == nil {
		p = c.plan(fds, dst)
	}
	values := r.RawValues()
	if !p.fits(fds) || len(values) != len(dst) {
		return row.Scan(dst...)
	}
	for i, plan := range p.plans {
		if err := plan.Scan(values[i], dst[i]); err != nil {
			return pgx.ScanArgError{ColumnIndex: i, FieldName: fds[i].Name, Err: err}
		}
	}
	return nil
}

// plan makes the plans for rows shaped like fds and stores them (once; a later caller with
// another shape gets the first shape's plans, which do not fit it, and scans through pgx).
func (c *planCache) plan(fds []pgconn.FieldDescription, dst []any) *rowPlans {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.plans.Load(); p != nil {
		return p
	}
	types := pgtype.NewMap()
	p := &rowPlans{}
	if len(fds) == len(dst) {
		for i, fd := range fds {
			p.oids = append(p.oids, fd.DataTypeOID)
			p.formats = append(p.formats, fd.Format)
			p.plans = append(p.plans, types.PlanScan(fd.DataTypeOID, fd.Format, dst[i]))
		}
	}
	c.plans.Store(p)
	return p
}

// sessionScans are the plans of scanSession.
var sessionScans planCache
