package crash

import (
	"os"
	"testing"

	"github.com/relayq/relay/internal/relaybin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	relaybin.Cleanup()
	os.Exit(code)
}
