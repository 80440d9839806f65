package worker

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// planSettings are the server settings under which a worker's connections
// keep one plan for each statement (KeepGenericPlans).
//
// PostgreSQL plans a prepared statement at every call for as long as a
// plan made for its values looks cheaper than one made for any values,
// and so it planned every claim anew: a claim spent more time being
// planned than run (docs/experiments.md, "What a claim costs to plan").
// Under force_generic_plan each statement keeps a generic plan, made anew
// whenever the statistics of jobs change; each of the worker's statements
// is written so that its generic plan reads jobs through an index
// (TestStatements_GenericPlansLookJobsUpByIndex). JIT compilation is off:
// a generic plan's estimated cost grows with the backlog the statistics
// count, and past jit_above_cost a kept plan would be compiled again at
// every call, which a statement run thousands of times a second never
// earns back.
var planSettings = map[string]string{
	"plan_cache_mode": "force_generic_plan",
	"jit":             "off",
}

// KeepGenericPlans gives the connections of cfg, a worker's pool,
// plan_cache_mode=force_generic_plan and jit=off, each unless its URL
// sets it: each statement then keeps one generic plan, and none is
// compiled. It leaves cfg as it is where statements run unprepared (a
// default_query_exec_mode other than cache_statement, as behind a
// transaction-mode pooler, which would also refuse the settings when a
// connection starts): no plan is kept there.
// relay work does this for its pool; a program that runs a Worker may do
// it before it opens the Worker's pool:
//
//	cfg, err := pgxpool.ParseConfig(url)
//	worker.KeepGenericPlans(cfg)
//	pool, err := pgxpool.NewWithConfig(ctx, cfg)
func KeepGenericPlans(cfg *pgxpool.Config) {
	if cfg.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return
	}
	for name, value := range planSettings {
		if _, ok := cfg.ConnConfig.RuntimeParams[name]; !ok {
			cfg.ConnConfig.RuntimeParams[name] = value
		}
	}
}
