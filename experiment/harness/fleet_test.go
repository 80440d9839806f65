package harness

import (
	"math"
	"strings"
	"testing"
	"time"
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

func TestCheckFleetLoad_RefusesALoadItCannotOfferOrForNoFleet(t *testing.T) {
	for _, tc := range []struct {
		size    int
		rate    float64
		job     time.Duration
		wantErr string
	}{
		{size: 0},
		{size: 150},
		{size: 150, rate: 300},
		{size: 150, rate: 300, job: 50 * time.Millisecond},
		{size: 2, rate: minFleetRate},
		{size: 2, rate: -1, wantErr: "not negative"},
		{size: 2, rate: math.NaN(), wantErr: "finite"},
		{size: 2, rate: math.Inf(1), wantErr: "finite"},
		{size: 2, rate: 10, job: -time.Millisecond, wantErr: "not negative"},
		{size: 2, rate: minFleetRate / 2, wantErr: "at least"},
		{size: 0, rate: 10, wantErr: "for no fleet"},
		{size: 2, job: 10 * time.Millisecond, wantErr: "for an idle fleet"},
		{size: 2, rate: 10, job: 1500 * time.Microsecond, wantErr: "whole milliseconds"},
		{size: 2, rate: 10, job: 2 * time.Hour, wantErr: "at most"},
	} {
		err := CheckFleetLoad(tc.size, tc.rate, tc.job)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("CheckFleetLoad(%d, %g, %s) = %v, want nil", tc.size, tc.rate, tc.job, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("CheckFleetLoad(%d, %g, %s) = %v, want an error saying %q", tc.size, tc.rate, tc.job, err, tc.wantErr)
		}
	}
}
