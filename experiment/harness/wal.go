package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/relayq/relay/experiment/labdb"
)

// WALWindow is a span of the WAL a server writes, from its Open to its
// Records, which pg_waldump reads from the server's own pg_wal: what the
// transactions of an experiment wrote, record type by record type. The
// server must run on this host, with its WAL readable here.
type WALWindow struct {
	slot    string
	start   string
	walDir  string
	waldump string
}

// OpenWALWindow opens a window on the WAL of q's server from now on,
// holding its segments with a physical replication slot named slot until
// Close. It fails where the WAL cannot be read here: a server on another
// host, or no pg_waldump of the server's major version.
func OpenWALWindow(ctx context.Context, q *labdb.Queries, slot string) (*WALWindow, error) {
	r, err := q.ExperimentWALWindowOpen(ctx, slot)
	if err != nil {
		return nil, fmt.Errorf("open a window on the WAL: %w", err)
	}
	w := &WALWindow{slot: r.SlotName, start: r.Lsn, walDir: filepath.Join(r.DataDirectory, "pg_wal")}
	if w.waldump, err = findWaldump(int(r.MajorVersion)); err == nil {
		if _, err = os.ReadDir(w.walDir); err != nil {
			err = fmt.Errorf("read the server's WAL here: %w", err)
		}
	}
	if err != nil {
		return nil, errors.Join(err, w.Close(ctx, q))
	}
	return w, nil
}

// Records reads the window from its start to the WAL flushed by now, and
// returns how many records of each type it holds, by pg_waldump's name
// for the type ("Btree/INSERT_LEAF", "Heap/HOT_UPDATE", ...).
func (w *WALWindow) Records(ctx context.Context, q *labdb.Queries) (map[string]int64, error) {
	end, err := q.ExperimentWALFlushed(ctx)
	if err != nil {
		return nil, fmt.Errorf("read where the WAL ends: %w", err)
	}
	cmd := exec.CommandContext(ctx, w.waldump, "--stats=record", "--path", w.walDir, "--start", w.start, "--end", end)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s from %s to %s: %w: %s", w.waldump, w.start, end, err, strings.TrimSpace(stderr.String()))
	}
	return parseWALStats(out)
}

// Close drops the window's slot.
func (w *WALWindow) Close(ctx context.Context, q *labdb.Queries) error {
	if err := q.ExperimentWALWindowClose(context.WithoutCancel(ctx), w.slot); err != nil {
		return fmt.Errorf("drop the replication slot %s: %w", w.slot, err)
	}
	return nil
}

// IndexEntries counts the B-tree leaf entries a window's records wrote:
// each insert into a leaf page, plain or into a posting list, and each
// split, which carries the entry whose insert split the page. Splits of
// inner pages count too; there is one for every few hundred leaf splits.
func IndexEntries(records map[string]int64) int64 {
	return records["Btree/INSERT_LEAF"] + records["Btree/INSERT_POST"] +
		records["Btree/SPLIT_L"] + records["Btree/SPLIT_R"]
}

// parseWALStats reads the table of pg_waldump --stats=record: a line per
// record type, its name and then its count.
func parseWALStats(out []byte) (map[string]int64, error) {
	records := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || !strings.Contains(f[0], "/") {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		records[f[0]] += n
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(records) == 0 {
		return nil, fmt.Errorf("pg_waldump printed no record types:\n%s", out)
	}
	return records, nil
}

// findWaldump returns the pg_waldump of PostgreSQL's major version given:
// Debian's and the PGDG packages' directories, then PATH if its version
// matches.
func findWaldump(major int) (string, error) {
	for _, p := range []string{
		fmt.Sprintf("/usr/lib/postgresql/%d/bin/pg_waldump", major),
		fmt.Sprintf("/usr/pgsql-%d/bin/pg_waldump", major),
	} {
		if _, err := exec.LookPath(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("pg_waldump"); err == nil {
		out, err := exec.Command(p, "--version").Output()
		if err == nil && strings.Contains(string(out), fmt.Sprintf(" %d.", major)) {
			return p, nil
		}
	}
	return "", fmt.Errorf("no pg_waldump of PostgreSQL %d found", major)
}
