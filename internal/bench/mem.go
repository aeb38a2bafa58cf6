package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
)

// memSample is the process's memory at one moment, after a full GC.
//
// Heap is the live Go heap. Mapped is anonymous read-write memory mapped
// outside the Go runtime: the sum of the anonymous rw mappings in
// /proc/self/maps less what the runtime says it mapped. In this process that
// is the verbs layer's MR memory (AllocMemory mmaps it): what a hardware
// provider pins at registration. RSS is the resident anonymous memory
// (RssAnon): what this machine actually holds, which for the soft provider
// counts only the MR pages that were touched.
//
// Under the race detector Mapped also holds the detector's shadow memory,
// which grows with the heap: E2 figures from a -race build are not
// meaningful.
type memSample struct {
	Heap   int64
	Mapped int64
	RSS    int64
	// Maps is the number of mappings (every line of /proc/self/maps),
	// which vm.max_map_count bounds.
	Maps int64
}

var memMetrics = []string{"/gc/heap/live:bytes", "/memory/classes/total:bytes"}

// sampleMemory collects garbage twice (finalizers of the first may free
// more) and reads the three measures.
func sampleMemory() (memSample, error) {
	runtime.GC()
	runtime.GC()
	ms := make([]metrics.Sample, len(memMetrics))
	for i, n := range memMetrics {
		ms[i].Name = n
	}
	anon, maps, err := anonMapped()
	if err != nil {
		return memSample{}, err
	}
	metrics.Read(ms)
	rss, err := rssAnon()
	if err != nil {
		return memSample{}, err
	}
	return memSample{
		Heap:   int64(ms[0].Value.Uint64()),
		Mapped: anon - int64(ms[1].Value.Uint64()),
		RSS:    rss,
		Maps:   maps,
	}, nil
}

// sub is the growth from b to s.
func (s memSample) sub(b memSample) memSample {
	return memSample{Heap: s.Heap - b.Heap, Mapped: s.Mapped - b.Mapped, RSS: s.RSS - b.RSS, Maps: s.Maps - b.Maps}
}

// anonMapped sums the sizes of the anonymous read-write mappings and
// counts every mapping.
func anonMapped() (total, maps int64, err error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, 0, fmt.Errorf("bench: read mappings: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		maps++
		// start-end perms offset dev inode [path]; anonymous mappings
		// have inode 0 and no path, or a name in brackets.
		fields := bytes.Fields(sc.Bytes())
		if len(fields) < 5 {
			continue
		}
		if len(fields) > 5 && (fields[5][0] != '[' || string(fields[5]) == "[stack]") {
			continue // a file, or the main thread's stack
		}
		if !bytes.HasPrefix(fields[1], []byte("rw")) || string(fields[4]) != "0" {
			continue
		}
		lo, hi, ok := bytes.Cut(fields[0], []byte("-"))
		if !ok {
			continue
		}
		a, err1 := strconv.ParseUint(string(lo), 16, 64)
		b, err2 := strconv.ParseUint(string(hi), 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		total += int64(b - a)
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("bench: read mappings: %w", err)
	}
	return total, maps, nil
}

// rssAnon reads RssAnon from /proc/self/status.
func rssAnon() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("bench: read status: %w", err)
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("RssAnon:")); ok {
			f := bytes.Fields(v)
			if len(f) != 2 || string(f[1]) != "kB" {
				break
			}
			n, err := strconv.ParseInt(string(f[0]), 10, 64)
			if err != nil {
				break
			}
			return n << 10, nil
		}
	}
	return 0, fmt.Errorf("bench: no RssAnon in /proc/self/status")
}

// readUint reads a file holding one decimal number.
func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
}
