package pgbouncer

// Dir returns the bouncer's temporary directory, for tests to see that
// Close removes it.
func (b *Bouncer) Dir() string { return b.dir }
