package bench

import (
	"fmt"
	"slices"
)

// recordKey is what a record measures, whatever the run.
type recordKey struct {
	suite, design, mode, transport string
	nic                            bool
	vconns, producers, msgBytes    int
	pollers                        int
	loss                           float64
}

func keyOf(r *Record) recordKey {
	k := recordKey{suite: r.Suite, design: r.Design, mode: r.Mode, transport: r.Transport, nic: r.NICModel,
		vconns: r.VConns, producers: r.Producers, pollers: r.Pollers}
	// E1 and E3 fix the size; E2 has none; E5 is keyed by it, and its
	// loss sweep by the loss too.
	if r.Suite == "e5" || r.Suite == "e5loss" {
		k.msgBytes = r.MsgBytes
	}
	if r.Loss != nil {
		k.loss = *r.Loss
	}
	return k
}

// MergeRuns folds the records of consecutive runs, concatenated (the k-th
// record of a measurement belongs to run k), into one record per
// measurement: its samples are every run's in order, its rates the median
// of them, its other figures the median of the runs'. A measurement that
// failed in any run is an error line naming the first run that failed
// (none, where every run failed alike). Records of a single run come back
// unchanged.
func MergeRuns(recs []Record) []Record {
	groups := map[recordKey][]Record{}
	var order []recordKey
	for _, r := range recs {
		k := keyOf(&r)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	if len(order) == len(recs) {
		return recs
	}
	out := make([]Record, 0, len(order))
	for _, k := range order {
		out = append(out, merge(groups[k]))
	}
	return out
}

func merge(runs []Record) Record {
	if len(runs) == 1 {
		return runs[0]
	}
	m := runs[0]
	same := true
	for _, r := range runs {
		same = same && r.Error == runs[0].Error
	}
	if same && m.Error != "" {
		return m // failed, or not run, alike in every run
	}
	for i, r := range runs {
		if r.Error != "" {
			m = r
			m.Error = fmt.Sprintf("run %d of %d: %s", i+1, len(runs), r.Error)
			return m
		}
	}
	var samples []float64
	for _, r := range runs {
		switch {
		case len(r.Samples) > 0:
			samples = append(samples, r.Samples...)
		case r.MsgsPerSec != nil:
			samples = append(samples, *r.MsgsPerSec)
		}
	}
	if len(samples) > 0 {
		m.Samples = samples
		m.MsgsPerSec = ptr(Median(samples))
	}
	med := func(v func(*Record) *float64) *float64 {
		var xs []float64
		for i := range runs {
			if p := v(&runs[i]); p != nil {
				xs = append(xs, *p)
			}
		}
		if len(xs) == 0 {
			return nil
		}
		return ptr(Median(xs))
	}
	m.CPUNsPerMsg = med(func(r *Record) *float64 { return r.CPUNsPerMsg })
	m.MBPerSec = med(func(r *Record) *float64 { return r.MBPerSec })
	m.BytesPerVConn = med(func(r *Record) *float64 { return r.BytesPerVConn })
	m.HeapBytesPerVConn = med(func(r *Record) *float64 { return r.HeapBytesPerVConn })
	m.MappedBytesPerVConn = med(func(r *Record) *float64 { return r.MappedBytesPerVConn })
	m.RSSBytesPerVConn = med(func(r *Record) *float64 { return r.RSSBytesPerVConn })
	secs := make([]float64, len(runs))
	for i, r := range runs {
		secs[i] = r.SetupSeconds
	}
	m.SetupSeconds = slices.Max(secs)
	return m
}
