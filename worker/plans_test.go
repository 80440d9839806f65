package worker_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/worker"
)

func TestKeepGenericPlans_SetsThePlanSettingsUnlessTheURLDoes(t *testing.T) {
	tests := []struct {
		name, url     string
		planCacheMode string
		jit           string
	}{
		{"prepared statements", "postgres://u@localhost/relay", "force_generic_plan", "off"},
		{"plan_cache_mode in the URL", "postgres://u@localhost/relay?plan_cache_mode=auto", "auto", "off"},
		{"jit in the URL", "postgres://u@localhost/relay?jit=on", "force_generic_plan", "on"},
		{"statements unprepared", "postgres://u@localhost/relay?default_query_exec_mode=cache_describe", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			worker.KeepGenericPlans(cfg)
			params := cfg.ConnConfig.RuntimeParams
			if params["plan_cache_mode"] != tt.planCacheMode || params["jit"] != tt.jit {
				t.Errorf("plan_cache_mode %q, jit %q; want %q, %q", params["plan_cache_mode"], params["jit"], tt.planCacheMode, tt.jit)
			}
		})
	}
}
