package main

import (
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/internal/dbtest"
)

func TestConnect_KeepsAFewConnectionsOpenUnlessTheURLSaysOtherwise(t *testing.T) {
	dsn := dbtest.NewURL(t)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	tests := []struct {
		name string
		dsn  string
		want int32
	}{
		{"default", dsn, minConns},
		{"pool_min_conns in the URL", dsn + sep + "pool_min_conns=1", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t, 30*time.Second)
			pool, err := connect(ctx, tt.dsn, "relay-test")
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer pool.Close()
			if got := pool.Config().MinConns; got != tt.want {
				t.Errorf("MinConns = %d, want %d", got, tt.want)
			}
		})
	}
}
