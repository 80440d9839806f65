package main

import "testing"

func TestPoolConfig_KeepsConnectionsOpenAsAskedUnlessTheURLSaysOtherwise(t *testing.T) {
	tests := []struct {
		name     string
		dsn      string
		minConns int32
		want     int32
	}{
		{"a serving command", "postgres://u@localhost/relay", servingMinConns, servingMinConns},
		{"a one-shot command", "postgres://u@localhost/relay", 0, 0},
		{"pool_min_conns in the URL", "postgres://u@localhost/relay?pool_min_conns=1", servingMinConns, 1},
		{"pool_min_conns in keyword/value form", "host=localhost dbname=relay pool_min_conns=2", 0, 2},
		{"never more than the pool's maximum", "postgres://u@localhost/relay?pool_max_conns=2", servingMinConns, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := poolConfig(tt.dsn, "relay-test", tt.minConns)
			if err != nil {
				t.Fatalf("poolConfig: %v", err)
			}
			if cfg.MinConns != tt.want {
				t.Errorf("MinConns = %d, want %d", cfg.MinConns, tt.want)
			}
		})
	}
}

func TestPoolConfig_NamesTheApplicationUnlessTheURLDoes(t *testing.T) {
	tests := []struct{ dsn, want string }{
		{"postgres://u@localhost/relay", "relay work"},
		{"postgres://u@localhost/relay?application_name=mine", "mine"},
	}
	for _, tt := range tests {
		cfg, err := poolConfig(tt.dsn, "relay work", 0)
		if err != nil {
			t.Fatalf("poolConfig(%q): %v", tt.dsn, err)
		}
		if got := cfg.ConnConfig.RuntimeParams["application_name"]; got != tt.want {
			t.Errorf("poolConfig(%q): application_name = %q, want %q", tt.dsn, got, tt.want)
		}
	}
}
