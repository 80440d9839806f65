package chaos

import (
	"testing"

	"github.com/relayq/relay/internal/relaybin"
)

func TestMain(m *testing.M) { relaybin.RunTests(m) }
