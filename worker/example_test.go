package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
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

	// Enqueue in a transaction of the program's own: the job exists for
	// workers when, and only if, the transaction commits. client.Begin's
	// transaction is a pgx.Tx whose Commit tells the queue's workers once
	// it has committed, so that its commit does not queue behind the
	// server's other notifying commits.
	tx, err := client.Begin(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	spec, err := client.Validate(client.Request{
		Kind:        "welcome",
		Queue:       ptr("emails"),
		Payload:     json.RawMessage(`{"to": "ada@example.com"}`),
		MaxAttempts: ptr[int64](5),
	}, time.Now())
	if err != nil {
		log.Fatal(err) // a *client.FieldError names the field at fault
	}
	job, _, err := client.Insert(ctx, tx, spec)
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
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

// ptr returns a pointer to v, for the optional fields of client.Request.
func ptr[T any](v T) *T { return &v }
