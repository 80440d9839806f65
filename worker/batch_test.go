package worker

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestSendIsolating_SplitsDownToTheRowsRefusedAndSendsEveryOtherRowOnce(t *testing.T) {
	bad := map[int]bool{3: true, 7: true, 8: true}
	tests := []struct {
		name        string
		items       []int
		wantRefused []int
	}{
		{"no row refused", []int{0, 1, 2, 4, 5, 6, 9}, nil},
		{"three rows refused among ten", []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, []int{3, 7, 8}},
		{"a batch of one refused row", []int{3}, []int{3}},
		{"empty batch", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			items := tt.items
			var sent []int
			refused, settled, err := sendIsolating(context.Background(), items, func(_ context.Context, part []int) error {
				for _, v := range part {
					if bad[v] {
						return &pgconn.PgError{Code: "22023", Message: "refused"}
					}
				}
				sent = append(sent, part...)
				return nil
			})
			if err != nil || settled != len(items) {
				t.Fatalf("settled %d of %d, err %v; want all, no error", settled, len(items), err)
			}
			var got []int
			for i := range refused {
				got = append(got, items[i])
			}
			slices.Sort(got)
			if diff := cmp.Diff(tt.wantRefused, got); diff != "" {
				t.Errorf("refused (-want +got):\n%s", diff)
			}
			slices.Sort(sent)
			var wantSent []int
			for _, v := range items {
				if !bad[v] {
					wantSent = append(wantSent, v)
				}
			}
			if diff := cmp.Diff(wantSent, sent); diff != "" {
				t.Errorf("rows sent and accepted (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSendIsolating_ReturnsOtherErrorsWithoutSplitting(t *testing.T) {
	calls := 0
	lost := errors.New("connection lost")
	_, settled, err := sendIsolating(context.Background(), []int{1, 2, 3, 4}, func(context.Context, []int) error {
		calls++
		return lost
	})
	if !errors.Is(err, lost) || calls != 1 || settled != 0 {
		t.Errorf("got %v after %d calls, %d settled; want the connection error after 1, none settled", err, calls, settled)
	}
}

// TestSendIsolating_SaysWhatWasSettledWhenAnotherErrorEndsTheIsolation
// refuses row 3 of ten, then loses the connection on the part holding row
// 7: the rows before that part were each taken or refused, and only the
// rest are to be sent again.
func TestSendIsolating_SaysWhatWasSettledWhenAnotherErrorEndsTheIsolation(t *testing.T) {
	lost := errors.New("connection lost")
	var sent []int
	refused, settled, err := sendIsolating(context.Background(), []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, func(_ context.Context, part []int) error {
		switch {
		case slices.Contains(part, 3):
			return &pgconn.PgError{Code: "22023", Message: "refused"}
		case slices.Contains(part, 7):
			return lost
		}
		sent = append(sent, part...)
		return nil
	})
	if !errors.Is(err, lost) {
		t.Fatalf("err %v, want the connection error", err)
	}
	if settled != 5 {
		t.Errorf("settled %d, want 5: rows 0 to 4 were each taken or refused", settled)
	}
	if _, ok := refused[3]; !ok || len(refused) != 1 {
		t.Errorf("refused %v, want row 3 alone", refused)
	}
	if diff := cmp.Diff([]int{0, 1, 2, 4}, sent); diff != "" {
		t.Errorf("rows taken (-want +got):\n%s", diff)
	}
}
