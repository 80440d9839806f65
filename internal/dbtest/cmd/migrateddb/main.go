// Command migrateddb prints the URL of a database migrated to the current
// schema, on the server the tests use (see package dbtest), creating it if
// needed. The Makefile hands it to sqlc vet.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/relayq/relay/internal/dbtest"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url, err := dbtest.Named(ctx, "relay_sqlc_vet")
	if err != nil {
		fmt.Fprintln(os.Stderr, "migrateddb:", err)
		os.Exit(1)
	}
	fmt.Println(url)
}
