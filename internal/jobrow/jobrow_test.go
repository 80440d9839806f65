package jobrow_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/jobrow"
)

// TestOfTransition_CarriesEveryColumnOfTheJob fills every field of a row
// and wants each field of the job it gives set from it: a column added to
// jobs, which sqlc adds to both types, fails this test until OfTransition
// copies it.
func TestOfTransition_CarriesEveryColumnOfTheJob(t *testing.T) {
	var row db.JobCancelRow
	fill(t, reflect.ValueOf(&row).Elem(), "row")
	job := jobrow.OfTransition(row)
	jv, rv := reflect.ValueOf(job), reflect.ValueOf(row)
	for i := range jv.NumField() {
		name := jv.Type().Field(i).Name
		rf := rv.FieldByName(name)
		if !rf.IsValid() {
			t.Errorf("db.JobCancelRow has no field %s", name)
			continue
		}
		if !reflect.DeepEqual(jv.Field(i).Interface(), rf.Interface()) {
			t.Errorf("job.%s = %v, want the row's %v", name, jv.Field(i).Interface(), rf.Interface())
		}
	}
	// Every other field of the row is one the job does not have.
	for i := range rv.NumField() {
		name := rv.Type().Field(i).Name
		if _, ok := jv.Type().FieldByName(name); !ok && name != "Applied" {
			t.Errorf("db.JobCancelRow has a field %s that is neither the job's nor Applied", name)
		}
	}
}

// fill sets v, and everything it holds, to a value other than its zero.
func fill(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	if v.Type() == reflect.TypeFor[time.Time]() {
		v.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)))
		return
	}
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.String:
		v.SetString("x")
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), path)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(t, v.Index(0), path)
	case reflect.Array:
		for i := range v.Len() {
			fill(t, v.Index(i), path)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(t, v.Field(i), path+"."+v.Type().Field(i).Name)
			}
		}
	default:
		t.Fatalf("%s: cannot fill a %s", path, v.Type())
	}
	if v.IsZero() {
		t.Fatalf("%s: still zero once filled", path)
	}
}
