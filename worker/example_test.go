package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/worker"
)

// A program that enqueues a job and runs a worker for it until interrupted.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// Enqueue: one typed statement from queries/jobs.sql.
	job, err := db.New(pool).JobInsert(ctx, db.JobInsertParams{
		Queue:       "emails",
		Kind:        "welcome",
		Payload:     json.RawMessage(`{"to": "ada@example.com"}`),
		MaxAttempts: 5,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("enqueued job", job.ID)

	w, err := worker.New(pool, worker.Config{Queue: "emails", Slots: 4})
	if err != nil {
		log.Fatal(err)
	}
	w.HandleFunc("welcome", func(ctx context.Context, job *worker.Job) (any, error) {
		var p struct {
			To string `json:"to"`
		}
		if err := json.Unmarshal(job.Payload, &p); err != nil {
			return nil, worker.Permanent(err) // retrying cannot fix bad input
		}
		// Pass job.Fence along with any external write, so the other system
		// can refuse a write from an attempt that has been superseded.
		return map[string]string{"sent_to": p.To}, nil
	})
	// Run returns after ctx is cancelled and running jobs are drained.
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
