package stripegw

import (
	"testing"

	"go.uber.org/goleak"
)

// The tests start stripe-mock, httptest servers and HTTP transports; every one of them must be
// gone when the package's tests end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
