package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
)

// A web service whose request handlers each enqueue one job. One Enqueuer,
// shared by every handler, stores the jobs of the requests that arrive
// together in one statement and one commit, and spaces the notifications
// that wake the queue's workers.
func ExampleEnqueuer() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// At most one notifying statement every 2 ms, by default.
	enq := client.NewEnqueuer(pool, client.EnqueuerConfig{})
	// Sends what is still owed; before pool.Close, with a context not
	// cancelled yet, and within EnqueuerConfig.StoreTimeout.
	defer enq.Close(context.WithoutCancel(ctx))

	http.HandleFunc("POST /signup", func(w http.ResponseWriter, r *http.Request) {
		payload, _ := json.Marshal(map[string]string{"to": r.FormValue("email")})
		spec, err := client.Validate(client.Request{Kind: "welcome", Queue: ptr("emails"), Payload: payload}, time.Now())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest) // a *client.FieldError names the field at fault
			return
		}
		// Returns once this job has committed, with its id.
		job, err := enq.Insert(r.Context(), spec)
		if err != nil {
			http.Error(w, "could not enqueue", http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]int64{"job": job.ID})
	})
	srv := &http.Server{Addr: ":8080"}
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}
