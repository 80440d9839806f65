package experiment

import (
	"encoding/json"
	"time"

	"github.com/relayq/relay/db"
)

// addJob appends one job to the parameters of a JobInsertMany: on queue,
// of kind, with payload and maxAttempts, at priority 0, ready at once.
func addJob(p *db.JobInsertManyParams, queue, kind string, payload json.RawMessage, maxAttempts int32) {
	p.Queues = append(p.Queues, queue)
	p.Kinds = append(p.Kinds, kind)
	p.Payloads = append(p.Payloads, payload)
	p.Priorities = append(p.Priorities, 0)
	p.MaxAttempts = append(p.MaxAttempts, maxAttempts)
	p.RunAts = append(p.RunAts, time.Time{})
	p.DelaysMs = append(p.DelaysMs, 0)
}
