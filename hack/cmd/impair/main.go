// Command impair impairs the packets that iptables sends to an NFQUEUE
// queue: it drops some, holds some back so that they arrive out of order,
// and can delay all. The local cluster (hack/local-cluster/node.sh netem)
// uses it where the kernel has no sch_netem.
//
//	impair --queue N [--loss 5%] [--reorder 5%] [--delay 1ms] [--hold-max 5ms]
//	       [--seed S] [--stats FILE] [--interval 5s]
//
// It binds queue N in its own network namespace. Its counters go to stderr
// every --interval and on SIGTERM or SIGINT, and as JSON to --stats.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fraction is a probability flag: "5%" or "0.05".
type fraction float64

func (f *fraction) String() string { return strconv.FormatFloat(float64(*f)*100, 'g', -1, 64) + "%" }

func (f *fraction) Set(s string) error {
	v, err := parseFraction(s)
	if err != nil {
		return err
	}
	*f = fraction(v)
	return nil
}

func parseFraction(s string) (float64, error) {
	pct := strings.HasSuffix(s, "%")
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	if err != nil {
		return 0, fmt.Errorf("not a probability: %q", s)
	}
	if pct {
		v /= 100
	}
	if v < 0 || v > 1 {
		return 0, fmt.Errorf("probability %q is not between 0 and 100%%", s)
	}
	return v, nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "impair: %v\n", err)
		os.Exit(1)
	}
}

// fileStats is what --stats holds.
type fileStats struct {
	Queue uint16 `json:"queue"`
	stats
	Held int `json:"held"`
}

// delayed is a batch of verdicts due at a time.
type delayed struct {
	due time.Time
	ids []uint32
}

// options are the command line's.
type options struct {
	loss, reorder  fraction
	queue, maxLen  uint
	delay, holdMax time.Duration
	interval       time.Duration
	seed           uint64
	statsFile      string
}

func parseFlags() (*options, error) {
	o := &options{}
	flag.UintVar(&o.queue, "queue", 0, "the NFQUEUE queue number to bind (required)")
	flag.DurationVar(&o.delay, "delay", 0, "a fixed delay for every packet accepted")
	flag.DurationVar(&o.holdMax, "hold-max", 5*time.Millisecond, "how long a held packet waits for a later one to pass it")
	flag.Uint64Var(&o.seed, "seed", 1, "the random generator's seed")
	flag.StringVar(&o.statsFile, "stats", "", "write the counters as JSON to this file")
	flag.DurationVar(&o.interval, "interval", 5*time.Second, "how often to print and write the counters")
	flag.UintVar(&o.maxLen, "queue-maxlen", 4096, "packets the kernel queues before it accepts the rest unimpaired")
	flag.Var(&o.loss, "loss", "the probability of dropping a packet (5% or 0.05)")
	flag.Var(&o.reorder, "reorder", "the probability of holding a packet back so later ones pass it")
	flag.Parse()
	switch {
	case flag.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", flag.Args())
	case !isSet("queue"):
		return nil, errors.New("--queue is required")
	case o.queue > 65535:
		return nil, fmt.Errorf("--queue %d: queue numbers go up to 65535", o.queue)
	case float64(o.loss)+float64(o.reorder) > 1:
		return nil, errors.New("--loss and --reorder add up to more than 100%")
	case o.delay < 0 || o.holdMax <= 0 || o.interval <= 0:
		return nil, errors.New("--delay must be >= 0, --hold-max and --interval > 0")
	}
	return o, nil
}

func run() error {
	o, err := parseFlags()
	if err != nil {
		return err
	}
	q, err := openQueue(uint16(o.queue), uint32(o.maxLen))
	if err != nil {
		return err
	}
	defer q.close()
	// Reads time out so the loop sees a signal within a tick.
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(q.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("setting a read timeout: %w", err)
	}

	im := &impairer{
		o:          o,
		q:          q,
		sched:      &scheduler{pol: newPolicy(o.seed, float64(o.loss), float64(o.reorder)), holdMax: o.holdMax},
		later:      make(chan delayed, 1<<16),
		senderDone: make(chan struct{}),
	}
	go im.sendLater()
	fmt.Fprintf(os.Stderr, "impair: queue %d bound: loss %v reorder %v delay %v hold-max %v seed %d\n",
		o.queue, &o.loss, &o.reorder, o.delay, o.holdMax, o.seed)
	im.report()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	for {
		select {
		case s := <-sigs:
			im.shutdown()
			fmt.Fprintf(os.Stderr, "impair: %v: exiting\n", s)
			im.report()
			return nil
		case <-tick.C:
			im.report()
		default:
		}
		ids, err := q.read()
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOBUFS) {
				continue
			}
			return fmt.Errorf("reading queue %d: %w", o.queue, err)
		}
		im.handle(ids)
	}
}

// impairer gives the queue's packets their verdicts as its scheduler says.
type impairer struct {
	o     *options
	q     *queue
	mu    sync.Mutex
	sched *scheduler
	// Delayed verdicts go through one FIFO so they keep their order.
	later chan delayed
	// closing is set, under mu, once later is closed.
	closing    bool
	senderDone chan struct{} // closed when sendLater has sent the last
}

// handle gives the packets ids their verdicts, now or once released.
func (im *impairer) handle(ids []uint32) {
	im.mu.Lock()
	defer im.mu.Unlock()
	for _, id := range ids {
		now := time.Now()
		rel, dropIt := im.sched.packet(id, now)
		if dropIt {
			im.send([]uint32{id}, nfDrop)
			continue
		}
		if len(rel) == 0 {
			time.AfterFunc(im.o.holdMax, func() {
				im.mu.Lock()
				defer im.mu.Unlock()
				if !im.closing {
					im.release(im.sched.expire(time.Now()))
				}
			})
		}
		im.release(rel)
	}
}

func (im *impairer) send(ids []uint32, v uint32) {
	for _, id := range ids {
		if err := im.q.verdict(id, v); err != nil {
			fmt.Fprintf(os.Stderr, "impair: %v\n", err)
		}
	}
}

// release accepts ids now or after --delay; mu is held.
func (im *impairer) release(ids []uint32) {
	if len(ids) == 0 {
		return
	}
	if im.o.delay == 0 {
		im.send(ids, nfAccept)
		return
	}
	im.later <- delayed{time.Now().Add(im.o.delay), ids}
}

// sendLater accepts the delayed verdicts when due, until later is closed.
func (im *impairer) sendLater() {
	defer close(im.senderDone)
	for d := range im.later {
		time.Sleep(time.Until(d.due))
		im.send(d.ids, nfAccept)
	}
}

// shutdown gives every packet the tool holds its verdict before it goes.
func (im *impairer) shutdown() {
	im.mu.Lock()
	im.release(im.sched.flush())
	im.closing = true
	close(im.later)
	im.mu.Unlock()
	<-im.senderDone
}

// report prints the counters and writes them to --stats.
func (im *impairer) report() {
	im.mu.Lock()
	fs := fileStats{Queue: im.q.num, stats: im.sched.stats, Held: len(im.sched.held)}
	im.mu.Unlock()
	fmt.Fprintf(os.Stderr, "impair: queue %d: packets %d dropped %d reordered %d\n", fs.Queue, fs.Packets, fs.Dropped, fs.Reordered)
	if im.o.statsFile != "" {
		if err := writeStats(im.o.statsFile, fs); err != nil {
			fmt.Fprintf(os.Stderr, "impair: %v\n", err)
		}
	}
}

// isSet reports whether a flag was given.
func isSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// writeStats replaces path with the counters, whole: a reader never sees
// half a file.
func writeStats(path string, fs fileStats) error {
	b, err := json.Marshal(fs)
	if err != nil {
		return fmt.Errorf("encoding the counters: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".impair-stats-*")
	if err != nil {
		return fmt.Errorf("writing the counters: %w", err)
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the counters: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the counters: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the counters: %w", err)
	}
	return nil
}
