package harness

import "testing"

func TestParseConfigs(t *testing.T) {
	got, err := ParseConfigs("1x1, 1x4,3x4")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseConfigs("500x1000"); err != nil {
		t.Errorf("ParseConfigs(%q): %v, want the largest configuration accepted", "500x1000", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	want := []ProcSlots{{Procs: 1, Slots: 1}, {Procs: 1, Slots: 4}, {Procs: 3, Slots: 4}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("got %v, want %v", got, want)
		}
	}
	if back := FormatConfigs(got); back != "1x1,1x4,3x4" {
		t.Errorf("FormatConfigs(%v) = %q, want %q", got, back, "1x1,1x4,3x4")
	}
	for _, bad := range []string{"", "1", "x4", "0x1", "1x0", "1x4,", "ax2", "501x1", "1x1001"} {
		if _, err := ParseConfigs(bad); err == nil {
			t.Errorf("ParseConfigs(%q) succeeded", bad)
		}
	}
}
