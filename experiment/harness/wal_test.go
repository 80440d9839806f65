package harness

import (
	"maps"
	"testing"
)

// waldumpStats is pg_waldump --stats=record's output for a table created
// with a primary key, filled with 1,000 rows and dropped (PostgreSQL 15).
const waldumpStats = `WAL statistics between 1/850FC280 and 1/85122830:
Type                                           N      (%)          Record size      (%)             FPI size      (%)        Combined size      (%)
----                                           -      ---          -----------      ---             --------      ---        -------------      ---
XLOG/FPI                                       1 (  0.05)                   49 (  0.04)                   88 (  0.47)                  137 (  0.09)
Transaction/COMMIT                             1 (  0.05)                 1245 (  0.94)                    0 (  0.00)                 1245 (  0.82)
Heap/INSERT                                 1001 ( 47.94)                59629 ( 44.86)                13176 ( 70.91)                72805 ( 48.05)
Heap/INSERT+INIT                               5 (  0.24)                  295 (  0.22)                    0 (  0.00)                  295 (  0.19)
Btree/INSERT_LEAF                           1041 ( 49.86)                66808 ( 50.26)                    0 (  0.00)                66808 ( 44.09)
Btree/INSERT_UPPER                             1 (  0.05)                   72 (  0.05)                    0 (  0.00)                   72 (  0.05)
Btree/SPLIT_R                                  2 (  0.10)                 1504 (  1.13)                    0 (  0.00)                 1504 (  0.99)
Btree/NEWROOT                                  2 (  0.10)                  212 (  0.16)                    0 (  0.00)                  212 (  0.14)
                                        --------                      --------                      --------                      --------
Total                                       2088                        132932 [87.74%]                18580 [12.26%]               151512 [100%]
`

func TestParseWALStats_CountsEachRecordTypeAndNotTheTotal(t *testing.T) {
	got, err := parseWALStats([]byte(waldumpStats))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{
		"XLOG/FPI": 1, "Transaction/COMMIT": 1, "Heap/INSERT": 1001, "Heap/INSERT+INIT": 5,
		"Btree/INSERT_LEAF": 1041, "Btree/INSERT_UPPER": 1, "Btree/SPLIT_R": 2, "Btree/NEWROOT": 2,
	}
	if !maps.Equal(got, want) {
		t.Errorf("record counts %v, want %v", got, want)
	}
	// Leaf inserts and the splits that carry one; not the inner pages'
	// inserts nor new roots.
	if n := IndexEntries(got); n != 1043 {
		t.Errorf("IndexEntries = %d, want 1043", n)
	}
}

func TestParseWALStats_RefusesOutputWithoutRecords(t *testing.T) {
	if _, err := parseWALStats([]byte("pg_waldump: error: could not find a valid record after 1/8B000028\n")); err == nil {
		t.Error("no error for output without a record type")
	}
}
