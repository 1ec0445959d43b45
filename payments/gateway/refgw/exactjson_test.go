package refgw

import (
	"strings"
	"testing"
)

// Every wire type decodes through decodeExact, which refuses (panics on) what it cannot filter
// exactly: an embedded struct, whose promoted fields encoding/json would read and the filter
// would drop. A wire type that gains one fails here, not silently in production.
func TestWireTypesDecodeExactly(t *testing.T) {
	t.Parallel()
	for _, v := range []any{&paymentJSON{}, &paymentList{}, &refundJSON{}, &errorJSON{}, &event{}, &eventPayment{}} {
		if err := decodeExact([]byte(`{"Unknown":1,"data":[{}]}`), v); err != nil && !strings.Contains(err.Error(), "cannot unmarshal") {
			t.Errorf("%T: %v", v, err)
		}
	}
	type inner struct {
		ID string `json:"id"`
	}
	type embeds struct {
		inner
		Status string `json:"status"`
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "embeds") {
			t.Fatalf("a type with an embedded struct decoded (recovered %v)", r)
		}
	}()
	_ = decodeExact([]byte(`{"id":"x","status":"pending"}`), &embeds{})
}
