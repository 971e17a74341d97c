// Package labdriver is what every Go lab driver shares: the command line and
// events of tests/lab (drivers_spec.md), message identity, pacing, the counts and
// the run's stop conditions. Each driver adds only its library's calls.
package labdriver

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"
)

// Driver is one client library behind the lab interface.
type Driver interface {
	// Config is the effective configuration for the start event.
	Config() map[string]any
	// Produce sends Args.Produce messages (Run.Pace, Run.Send before handing each
	// over, Run.Ack / Run.Fail on each outcome) and returns once every outcome is
	// in or ctx is done.
	Produce(ctx context.Context, r *Run)
	// Consume reads the topic from the earliest offset (Run.Assigned once it has
	// partitions, Run.Consumed for each record) until ctx is done.
	Consume(ctx context.Context, r *Run)
}

// Run is one driver run: its arguments, events, library log and counts.
type Run struct {
	Args   *Args
	Events *Events
	// Log is the library's log file (io.Discard without --log).
	Log io.Writer

	start          time.Time
	paceStart      time.Time // only the producer goroutine touches it
	ignored        []string
	mu             sync.Mutex
	sent           map[int]bool
	acked          map[int]bool
	failed         map[int]bool
	consumed       map[string]bool
	lastNew        time.Time
	producing      bool
	stopConsumeFns []context.CancelFunc
}

// IgnoreProp records a --prop the library has no knob for (start event and log).
func (r *Run) IgnoreProp(p Prop) {
	r.ignored = append(r.ignored, p.Key)
	fmt.Fprintf(r.Log, "labdriver: ignoring --prop %s=%s (no such knob in this library)\n", p.Key, p.Value)
}

// MessageID is "<client_id>:<seq>".
func (r *Run) MessageID(seq int) string { return fmt.Sprintf("%s:%d", r.Args.ClientID, seq) }

// Key is str(seq).
func (r *Run) Key(seq int) []byte { return []byte(fmt.Sprint(seq)) }

// Value is "<client_id>:<seq>:" padded with 'x' to --size bytes.
func (r *Run) Value(seq int) []byte {
	v := []byte(r.MessageID(seq) + ":")
	for len(v) < r.Args.Size {
		v = append(v, 'x')
	}
	return v
}

// IDFromValue recovers the message id: the text before the second ':'.
func IDFromValue(v []byte) string {
	s := string(v)
	first := strings.IndexByte(s, ':')
	if first < 0 {
		return s
	}
	second := strings.IndexByte(s[first+1:], ':')
	if second < 0 {
		return s
	}
	return s[:first+1+second]
}

// Pace waits until message seq is due under --rate (counted from the first
// call); false if ctx ended first. Call it from one goroutine.
func (r *Run) Pace(ctx context.Context, seq int) bool {
	if r.Args.Rate <= 0 {
		return ctx.Err() == nil
	}
	if r.paceStart.IsZero() { // the schedule starts at the first send, once the client is up
		r.paceStart = time.Now()
	}
	due := r.paceStart.Add(time.Duration(float64(seq) / r.Args.Rate * float64(time.Second)))
	wait := time.Until(due)
	if wait <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Partition is --partition as a pointer (nil: key-based).
func (r *Run) Partition() *int32 {
	if r.Args.Partition < 0 {
		return nil
	}
	p := r.Args.Partition
	return &p
}

// Send records that message seq is being handed to the library.
func (r *Run) Send(seq int) {
	r.mu.Lock()
	r.sent[seq] = true
	r.mu.Unlock()
	r.Events.Emit("send", "id", r.MessageID(seq), "seq", seq, "topic", r.Args.Topic, "partition", r.Partition())
}

// Ack records the library's success report (offset nil when unknown, e.g. acks=0).
func (r *Run) Ack(seq int, partition int32, offset *int64) {
	r.mu.Lock()
	r.acked[seq] = true
	r.mu.Unlock()
	r.Events.Emit("ack", "id", r.MessageID(seq), "seq", seq, "topic", r.Args.Topic, "partition", partition, "offset", offset)
}

// Fail records the library's final failure of message seq. code is the Kafka
// error code when the library exposes one; the name comes from Kafka's table.
func (r *Run) Fail(seq int, partition *int32, text string, code *int16) {
	r.mu.Lock()
	r.failed[seq] = true
	r.mu.Unlock()
	var name any
	if code != nil {
		if n, ok := ErrorNames[*code]; ok {
			name = n
		}
	}
	r.Events.Emit("error", "id", r.MessageID(seq), "seq", seq, "topic", r.Args.Topic, "partition", partition,
		"error", text, "error_code", code, "error_name", name)
}

// Assigned tells the run the consumer has its partitions: the idle clock starts now.
func (r *Run) Assigned() {
	r.mu.Lock()
	r.lastNew = time.Now()
	r.mu.Unlock()
}

// Consumed records one consumed record; it stops the consumer once --expect ids are seen.
func (r *Run) Consumed(value []byte, partition int32, offset int64) {
	id := IDFromValue(value)
	r.mu.Lock()
	if !r.consumed[id] {
		r.consumed[id] = true
		r.lastNew = time.Now()
	}
	done := r.Args.Expect > 0 && len(r.consumed) >= r.Args.Expect
	r.mu.Unlock()
	r.Events.Emit("consume", "id", id, "topic", r.Args.Topic, "partition", partition, "offset", offset,
		"group", nilIfEmpty(r.Args.Group))
	if done {
		r.stopConsuming()
	}
}

// Commit records an offset commit (offsets by partition; errText "" on success).
func (r *Run) Commit(offsets map[string]int64, errText string) {
	r.Events.Emit("commit", "group", r.Args.Group, "offsets", offsets, "error", nilIfEmpty(errText))
}

func (r *Run) stopConsuming() {
	r.mu.Lock()
	fns := r.stopConsumeFns
	r.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

// watchIdle stops the consumer after --idle-s without a new id. It does not fire
// while this driver is still producing: a stalled producer is not an idle topic.
func (r *Run) watchIdle(ctx context.Context) {
	idle := time.Duration(r.Args.IdleS * float64(time.Second))
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		r.mu.Lock()
		quiet := !r.producing && time.Since(r.lastNew) >= idle
		r.mu.Unlock()
		if quiet {
			r.stopConsuming()
			return
		}
	}
}

// LibraryVersion is the version of module path compiled into this binary
// (the replacement's version when go.mod replaces it).
func LibraryVersion(path string) string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, dep := range info.Deps {
		if dep.Path == path {
			if dep.Replace != nil {
				return dep.Replace.Version
			}
			return dep.Version
		}
	}
	return "unknown"
}

// Main runs a driver: parse the command line, set the library up, emit start,
// produce and consume concurrently within --duration-s, emit end and exit.
// setup returns the driver; it reports unknown --prop keys with Run.IgnoreProp.
func Main(library, modulePath string, setup func(r *Run) (Driver, error)) {
	args, err := ParseArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "driver:", err)
		os.Exit(2)
	}
	events, err := OpenEvents(args.Out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "driver:", err)
		os.Exit(2)
	}
	var logw io.Writer = io.Discard
	if args.Log != "" {
		f, err := os.Create(args.Log)
		if err != nil {
			fmt.Fprintln(os.Stderr, "driver:", err)
			os.Exit(2)
		}
		defer f.Close()
		logw = f
	}
	r := &Run{
		Args: args, Events: events, Log: logw, start: time.Now(), ignored: []string{},
		sent: map[int]bool{}, acked: map[int]bool{}, failed: map[int]bool{}, consumed: map[string]bool{},
	}
	drv, err := setup(r)
	if err != nil {
		fmt.Fprintln(os.Stderr, "driver: cannot set up", library+":", err)
		os.Exit(2)
	}
	events.Emit("start", "library", library, "library_version", LibraryVersion(modulePath),
		"client_id", args.ClientID, "args", args.Map(), "config", drv.Config(), "ignored_props", r.ignored)

	// The drivers stop at the deadline; the grace lets them hand back their last
	// outcomes before the end event, and the run still exits by --duration-s.
	duration := time.Duration(args.DurationS * float64(time.Second))
	grace := min(2*time.Second, duration/10)
	ctx, cancel := context.WithDeadline(context.Background(), r.start.Add(duration-grace))
	defer cancel()
	var wg sync.WaitGroup
	if args.Produce > 0 {
		r.producing = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			drv.Produce(ctx, r)
			r.mu.Lock()
			r.producing = false
			r.mu.Unlock()
		}()
	}
	if args.Consume {
		cctx, ccancel := context.WithCancel(ctx)
		r.stopConsumeFns = append(r.stopConsumeFns, ccancel)
		r.lastNew = time.Now()
		go r.watchIdle(cctx)
		wg.Add(1)
		go func() {
			defer wg.Done()
			drv.Consume(cctx, r)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	hard := time.NewTimer(time.Until(r.start.Add(duration - grace/4)))
	select {
	case <-done:
	case <-hard.C:
		fmt.Fprintln(logw, "labdriver: the library did not return by --duration-s; ending the run")
	}
	r.mu.Lock()
	unresolved := 0
	for seq := range r.sent {
		if !r.acked[seq] && !r.failed[seq] {
			unresolved++
		}
	}
	sent, acked, failed, consumed := len(r.sent), len(r.acked), len(r.failed), len(r.consumed)
	r.mu.Unlock()
	events.Emit("end", "sent", sent, "acked", acked, "failed", failed, "consumed", consumed, "unresolved", unresolved)
	_ = events.Close()
	os.Exit(0)
}
