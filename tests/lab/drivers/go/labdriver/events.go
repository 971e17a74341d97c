package labdriver

import (
	"bytes"
	"encoding/json"
	"os"
	"strconv"
	"sync"
	"time"
)

// Events writes the JSON-lines events file, one write per line so that a killed
// driver loses at most the line being written.
type Events struct {
	mu sync.Mutex
	f  *os.File
}

// OpenEvents creates (truncates) the events file.
func OpenEvents(path string) (*Events, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &Events{f: f}, nil
}

// Emit writes {"ts":..,"event":event, k1:v1, ...}; kv alternates keys and values,
// kept in that order so the lines read like the spec.
func (e *Events) Emit(event string, kv ...any) {
	ts := float64(time.Now().UnixMicro()) / 1e6
	buf := make([]byte, 0, 160)
	buf = append(buf, `{"ts":`...)
	buf = strconv.AppendFloat(buf, ts, 'f', 6, 64)
	buf = append(buf, `,"event":`...)
	buf = strconv.AppendQuote(buf, event)
	for i := 0; i+1 < len(kv); i += 2 {
		key, _ := kv[i].(string)
		value, err := marshal(kv[i+1])
		if err != nil {
			value, _ = marshal(err.Error())
		}
		buf = append(buf, ',')
		buf = strconv.AppendQuote(buf, key)
		buf = append(buf, ':')
		buf = append(buf, value...)
	}
	buf = append(buf, '}', '\n')
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.f.Write(buf)
}

// marshal is json.Marshal without HTML escaping (library error texts hold '<' and '>').
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// Close closes the file.
func (e *Events) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.f.Close()
}
