package labdriver

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Prop is one --prop KEY=VALUE, in command-line order.
type Prop struct {
	Key, Value string
}

// Args is the lab driver command line (tests/lab drivers_spec.md).
type Args struct {
	Bootstrap []string
	ClientID  string
	Topic     string
	Produce   int
	Rate      float64
	Size      int
	Acks      string // "0", "1" or "all"
	Partition int32  // -1: key-based
	Consume   bool
	Group     string
	Expect    int
	IdleS     float64
	DurationS float64
	Props     []Prop
	Out       string
	Log       string
}

type propList []Prop

func (p *propList) String() string { return fmt.Sprint(*p) }

func (p *propList) Set(s string) error {
	key, value, ok := strings.Cut(s, "=")
	if !ok || key == "" {
		return fmt.Errorf("--prop wants KEY=VALUE, got %q", s)
	}
	*p = append(*p, Prop{key, value})
	return nil
}

// ParseArgs parses argv (without the program name).
func ParseArgs(argv []string) (*Args, error) {
	fs := flag.NewFlagSet("driver", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a := &Args{}
	var bootstrap string
	var partition int
	var props propList
	fs.StringVar(&bootstrap, "bootstrap", "", "HOST:PORT[,HOST:PORT]")
	fs.StringVar(&a.ClientID, "client-id", "", "client.id")
	fs.StringVar(&a.Topic, "topic", "", "topic")
	fs.IntVar(&a.Produce, "produce", 0, "messages to send")
	fs.Float64Var(&a.Rate, "rate", 0, "messages per second (0 = unpaced)")
	fs.IntVar(&a.Size, "size", 100, "value size in bytes")
	fs.StringVar(&a.Acks, "acks", "all", "0|1|all")
	fs.IntVar(&partition, "partition", -1, "send every message to this partition")
	fs.BoolVar(&a.Consume, "consume", false, "consume the topic from the earliest offset")
	fs.StringVar(&a.Group, "group", "", "consumer group")
	fs.IntVar(&a.Expect, "expect", 0, "stop consuming after this many distinct ids")
	fs.Float64Var(&a.IdleS, "idle-s", 5, "stop consuming after this many seconds without a new message")
	fs.Float64Var(&a.DurationS, "duration-s", 60, "hard cap on the run")
	fs.Var(&props, "prop", "KEY=VALUE (repeatable)")
	fs.StringVar(&a.Out, "out", "", "JSON-lines events file")
	fs.StringVar(&a.Log, "log", "", "library log file")
	if err := fs.Parse(argv); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	for _, hp := range strings.Split(bootstrap, ",") {
		if hp = strings.TrimSpace(hp); hp != "" {
			a.Bootstrap = append(a.Bootstrap, hp)
		}
	}
	a.Partition = int32(partition)
	a.Props = props
	switch {
	case len(a.Bootstrap) == 0:
		return nil, errors.New("--bootstrap is required")
	case a.ClientID == "":
		return nil, errors.New("--client-id is required")
	case a.Topic == "":
		return nil, errors.New("--topic is required")
	case a.Out == "":
		return nil, errors.New("--out is required")
	case a.Acks != "0" && a.Acks != "1" && a.Acks != "all" && a.Acks != "-1":
		return nil, fmt.Errorf("--acks must be 0, 1 or all, not %q", a.Acks)
	case a.Produce < 0 || a.Size < 0 || a.Rate < 0 || a.Expect < 0:
		return nil, errors.New("--produce, --size, --rate and --expect must not be negative")
	case a.DurationS <= 0:
		return nil, errors.New("--duration-s must be positive")
	case a.Produce == 0 && !a.Consume:
		return nil, errors.New("nothing to do: give --produce N and/or --consume")
	}
	if a.Acks == "-1" {
		a.Acks = "all"
	}
	return a, nil
}

// Map is the arguments as the start event's "args" object.
func (a *Args) Map() map[string]any {
	props := map[string]string{}
	for _, p := range a.Props {
		props[p.Key] = p.Value
	}
	var partition any
	if a.Partition >= 0 {
		partition = a.Partition
	}
	return map[string]any{
		"bootstrap": strings.Join(a.Bootstrap, ","), "client_id": a.ClientID, "topic": a.Topic,
		"produce": a.Produce, "rate": a.Rate, "size": a.Size, "acks": a.Acks, "partition": partition,
		"consume": a.Consume, "group": nilIfEmpty(a.Group), "expect": a.Expect, "idle_s": a.IdleS,
		"duration_s": a.DurationS, "props": props, "out": a.Out, "log": nilIfEmpty(a.Log),
	}
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
