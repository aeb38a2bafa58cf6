package bench

import (
	"strings"
	"testing"
)

// TestMergeRuns folds three runs: samples concatenated in run order, the
// rate their median, other figures the runs' median; a failure in one run
// makes the line an error naming it, one alike in every run is kept as it
// is.
func TestMergeRuns(t *testing.T) {
	recs, err := ReadRecords(strings.NewReader(`{"suite":"e1","design":"engine","vconns":100,"msgs_per_sec":200,"cpu_ns_per_msg":10,"samples":[100,200,300]}
{"suite":"e1","design":"naive","vconns":100,"msgs_per_sec":50,"samples":[50,50,50]}
{"suite":"e5","transport":"rc","msg_bytes":16,"msgs_per_sec":7}
{"suite":"e5","transport":"ud","msg_bytes":16384,"error":"too large"}
{"suite":"e1","design":"engine","vconns":100,"msgs_per_sec":500,"cpu_ns_per_msg":30,"samples":[400,500,600]}
{"suite":"e1","design":"naive","vconns":100,"error":"send: retry counter exceeded"}
{"suite":"e5","transport":"rc","msg_bytes":16,"msgs_per_sec":9}
{"suite":"e5","transport":"ud","msg_bytes":16384,"error":"too large"}
{"suite":"e1","design":"engine","vconns":100,"msgs_per_sec":800,"cpu_ns_per_msg":20,"samples":[700,800,900]}
{"suite":"e1","design":"naive","vconns":100,"msgs_per_sec":50,"samples":[50,50,50]}
{"suite":"e5","transport":"rc","msg_bytes":16,"msgs_per_sec":8}
{"suite":"e5","transport":"ud","msg_bytes":16384,"error":"too large"}
`))
	if err != nil {
		t.Fatal(err)
	}
	m := MergeRuns(recs)
	if len(m) != 4 {
		t.Fatalf("%d records, want 4: %+v", len(m), m)
	}
	if m[3].Error != "too large" {
		t.Errorf("an error alike in every run: %q", m[3].Error)
	}
	e := m[0]
	if len(e.Samples) != 9 || e.Samples[3] != 400 || *e.MsgsPerSec != 500 || *e.CPUNsPerMsg != 20 {
		t.Errorf("engine: %+v", e)
	}
	if m[1].Error != "run 2 of 3: send: retry counter exceeded" || m[1].MsgsPerSec != nil {
		t.Errorf("naive: %+v", m[1])
	}
	if got := m[2]; len(got.Samples) != 3 || *got.MsgsPerSec != 8 {
		t.Errorf("e5: %+v", got)
	}
	one := recs[:4]
	if got := MergeRuns(one); len(got) != 4 || got[0].Samples[0] != 100 {
		t.Errorf("one run changed: %+v", got)
	}
}
