package harness

import (
	"strings"
	"testing"
)

func TestCheckFleet_RefusesNegativeSizesAndAPoolerForNoFleet(t *testing.T) {
	for _, tc := range []struct {
		size, pooler int
		wantErr      string
	}{
		{size: 0, pooler: 0},
		{size: 150, pooler: 0},
		{size: 150, pooler: 20},
		{size: -1, pooler: 0, wantErr: "must not be negative"},
		{size: 2, pooler: -1, wantErr: "must not be negative"},
		{size: 0, pooler: 20, wantErr: "for no fleet"},
	} {
		err := CheckFleet(tc.size, tc.pooler)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("CheckFleet(%d, %d) = %v, want nil", tc.size, tc.pooler, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("CheckFleet(%d, %d) = %v, want an error saying %q", tc.size, tc.pooler, err, tc.wantErr)
		}
	}
}
