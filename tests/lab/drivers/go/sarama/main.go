// Command sarama is the lab driver for Go sarama. One source serves two pinned
// versions: go.mod (github.com/IBM/sarama v1.43.3, the first release that refreshes
// metadata on KAFKA_STORAGE_ERROR) and sarama-1.27.0.mod (github.com/Shopify/sarama
// v1.27.0, Filebeat 8.16's, which does not), so only the API both share is used.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"kwire.lab/drivers/labdriver"
)

func main() {
	labdriver.Main("sarama", "github.com/IBM/sarama", setup)
}

type driver struct {
	cfg  *sarama.Config
	args *labdriver.Args
}

func setup(r *labdriver.Run) (labdriver.Driver, error) {
	a := r.Args
	sarama.Logger = log.New(r.Log, "[sarama] ", log.LstdFlags|log.Lmicroseconds)
	cfg := sarama.NewConfig()
	cfg.ClientID = a.ClientID
	cfg.Version = sarama.V2_1_0_0 // record batches (Produce v3+); a scenario lowers it with --prop version=
	cfg.Producer.Return.Successes = true
	cfg.Producer.Return.Errors = true
	switch a.Acks {
	case "0":
		cfg.Producer.RequiredAcks = sarama.NoResponse
	case "1":
		cfg.Producer.RequiredAcks = sarama.WaitForLocal
	default:
		cfg.Producer.RequiredAcks = sarama.WaitForAll
	}
	if a.Partition >= 0 {
		cfg.Producer.Partitioner = sarama.NewManualPartitioner
	}
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Return.Errors = true
	for _, p := range a.Props {
		known, err := applyProp(cfg, p)
		if err != nil {
			return nil, fmt.Errorf("--prop %s=%s: %w", p.Key, p.Value, err)
		}
		if !known {
			r.IgnoreProp(p)
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &driver{cfg: cfg, args: a}, nil
}

// applyProp maps a Kafka (Java-style) config key onto sarama's Config.
func applyProp(cfg *sarama.Config, p labdriver.Prop) (bool, error) {
	ms := func() (time.Duration, error) {
		n, err := strconv.Atoi(p.Value)
		return time.Duration(n) * time.Millisecond, err
	}
	var err error
	switch p.Key {
	case "version":
		cfg.Version, err = parseVersion(p.Value)
	case "retries":
		cfg.Producer.Retry.Max, err = strconv.Atoi(p.Value)
	case "retry.backoff.ms":
		cfg.Producer.Retry.Backoff, err = ms()
	case "request.timeout.ms":
		// Java sends request.timeout.ms as the Produce timeout and waits as long itself.
		cfg.Net.ReadTimeout, err = ms()
		cfg.Producer.Timeout = cfg.Net.ReadTimeout
	case "linger.ms":
		cfg.Producer.Flush.Frequency, err = ms()
	case "batch.size":
		cfg.Producer.Flush.Bytes, err = strconv.Atoi(p.Value)
	case "max.in.flight.requests.per.connection":
		cfg.Net.MaxOpenRequests, err = strconv.Atoi(p.Value)
	case "enable.idempotence":
		cfg.Producer.Idempotent, err = strconv.ParseBool(p.Value)
		if cfg.Producer.Idempotent {
			cfg.Net.MaxOpenRequests = 1
		}
	case "compression.type":
		codecs := map[string]sarama.CompressionCodec{"none": sarama.CompressionNone, "gzip": sarama.CompressionGZIP,
			"snappy": sarama.CompressionSnappy, "lz4": sarama.CompressionLZ4, "zstd": sarama.CompressionZSTD}
		codec, ok := codecs[p.Value]
		if !ok {
			return true, errors.New("unknown codec")
		}
		cfg.Producer.Compression = codec
	case "metadata.max.age.ms":
		cfg.Metadata.RefreshFrequency, err = ms()
	case "metadata.retry.max":
		cfg.Metadata.Retry.Max, err = strconv.Atoi(p.Value)
	case "metadata.retry.backoff.ms":
		cfg.Metadata.Retry.Backoff, err = ms()
	case "socket.connection.setup.timeout.ms":
		cfg.Net.DialTimeout, err = ms()
	case "max.request.size":
		cfg.Producer.MaxMessageBytes, err = strconv.Atoi(p.Value)
	case "session.timeout.ms":
		cfg.Consumer.Group.Session.Timeout, err = ms()
	case "heartbeat.interval.ms":
		cfg.Consumer.Group.Heartbeat.Interval, err = ms()
	case "auto.commit.interval.ms":
		cfg.Consumer.Offsets.AutoCommit.Interval, err = ms()
	case "fetch.max.wait.ms":
		cfg.Consumer.MaxWaitTime, err = ms()
	default:
		return false, nil
	}
	return true, err
}

// parseVersion accepts sarama's constant names (V2_1_0_0) and dotted versions (2.1.0, 0.9.0.0).
func parseVersion(s string) (sarama.KafkaVersion, error) {
	if strings.HasPrefix(s, "V") {
		parts := strings.Split(s[1:], "_")
		if len(parts) == 4 && parts[0] != "0" {
			parts = parts[:3] // sarama spells 1.0+ with three numbers
		}
		s = strings.Join(parts, ".")
	}
	return sarama.ParseKafkaVersion(s)
}

func (d *driver) Config() map[string]any {
	c := d.cfg
	return map[string]any{
		"acks": d.args.Acks, "required_acks": int(c.Producer.RequiredAcks), "retries": c.Producer.Retry.Max,
		"retry.backoff.ms": c.Producer.Retry.Backoff.Milliseconds(),
		"linger.ms":        c.Producer.Flush.Frequency.Milliseconds(),
		// sarama's client-side wait for any response, and the Produce request's broker-side timeout
		"request.timeout.ms": c.Net.ReadTimeout.Milliseconds(), "produce.timeout.ms": c.Producer.Timeout.Milliseconds(),
		"enable.idempotence": c.Producer.Idempotent, "max.in.flight.requests.per.connection": c.Net.MaxOpenRequests,
		"version": c.Version.String(), "compression.type": c.Producer.Compression.String(),
		"metadata.max.age.ms": c.Metadata.RefreshFrequency.Milliseconds(),
		"metadata.retry.max":  c.Metadata.Retry.Max, "metadata.retry.backoff.ms": c.Metadata.Retry.Backoff.Milliseconds(),
		"session.timeout.ms":    c.Consumer.Group.Session.Timeout.Milliseconds(),
		"heartbeat.interval.ms": c.Consumer.Group.Heartbeat.Interval.Milliseconds(),
		"partitioner":           map[bool]string{true: "manual", false: "hash"}[d.args.Partition >= 0],
	}
}

// retryUntil calls fn every 500 ms until it succeeds or ctx ends, logging each failure.
func retryUntil(ctx context.Context, what string, fn func() error) bool {
	for {
		err := fn()
		if err == nil {
			return true
		}
		sarama.Logger.Printf("labdriver: %s failed: %v", what, err)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// prePartitionErrors are KErrors sarama can return before the message has a
// partition (size check, topic metadata): Msg.Partition is meaningless then.
var prePartitionErrors = map[sarama.KError]bool{
	sarama.ErrMessageSizeTooLarge: true, sarama.ErrUnknownTopicOrPartition: true, sarama.ErrLeaderNotAvailable: true,
}

func (d *driver) Produce(ctx context.Context, r *labdriver.Run) {
	a := d.args
	var producer sarama.AsyncProducer
	if !retryUntil(ctx, "NewAsyncProducer", func() (err error) {
		producer, err = sarama.NewAsyncProducer(a.Bootstrap, d.cfg)
		return err
	}) {
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for m := range producer.Successes() {
			var offset *int64
			if d.cfg.Producer.RequiredAcks != sarama.NoResponse {
				offset = &m.Offset
			}
			r.Ack(m.Metadata.(int), m.Partition, offset)
		}
	}()
	go func() {
		defer wg.Done()
		for pe := range producer.Errors() {
			var kerr sarama.KError
			var code *int16
			partition := r.Partition()
			if errors.As(pe.Err, &kerr) {
				c := int16(kerr)
				code = &c
				if !prePartitionErrors[kerr] {
					partition = &pe.Msg.Partition // a broker answered for this partition
				}
			}
			r.Fail(pe.Msg.Metadata.(int), partition, pe.Err.Error(), code)
		}
	}()
send:
	for seq := 0; seq < a.Produce; seq++ {
		if !r.Pace(ctx, seq) {
			break
		}
		msg := &sarama.ProducerMessage{
			Topic: a.Topic, Key: sarama.ByteEncoder(r.Key(seq)), Value: sarama.ByteEncoder(r.Value(seq)), Metadata: seq,
		}
		if a.Partition >= 0 {
			msg.Partition = a.Partition
		}
		r.Send(seq)
		select {
		case producer.Input() <- msg:
		case <-ctx.Done():
			break send
		}
	}
	// AsyncClose flushes, then closes Successes and Errors once every message has its outcome.
	producer.AsyncClose()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

func (d *driver) Consume(ctx context.Context, r *labdriver.Run) {
	if d.args.Group != "" {
		d.consumeGroup(ctx, r)
	} else {
		d.consumeAssigned(ctx, r)
	}
}

// consumeAssigned reads every partition of the topic from the oldest offset, without a group.
func (d *driver) consumeAssigned(ctx context.Context, r *labdriver.Run) {
	a := d.args
	var consumer sarama.Consumer
	if !retryUntil(ctx, "NewConsumer", func() (err error) {
		consumer, err = sarama.NewConsumer(a.Bootstrap, d.cfg)
		return err
	}) {
		return
	}
	defer func() { go consumer.Close() }() // may block on a dead broker; the run ends regardless
	var partitions []int32
	if !retryUntil(ctx, "Partitions("+a.Topic+")", func() (err error) {
		partitions, err = consumer.Partitions(a.Topic)
		if err == nil && len(partitions) == 0 {
			err = errors.New("no partitions yet")
		}
		return err
	}) {
		return
	}
	var wg sync.WaitGroup
	for _, p := range partitions {
		var pc sarama.PartitionConsumer
		if !retryUntil(ctx, fmt.Sprintf("ConsumePartition(%s, %d)", a.Topic, p), func() (err error) {
			pc, err = consumer.ConsumePartition(a.Topic, p, sarama.OffsetOldest)
			return err
		}) {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pc.AsyncClose()
			for {
				select {
				case <-ctx.Done():
					return
				case m := <-pc.Messages():
					r.Consumed(m.Value, m.Partition, m.Offset)
				case err := <-pc.Errors():
					sarama.Logger.Printf("labdriver: partition consumer error: %v", err)
				}
			}
		}()
	}
	r.Assigned()
	wg.Wait()
}

type groupHandler struct{ r *labdriver.Run }

func (h groupHandler) Setup(sarama.ConsumerGroupSession) error {
	h.r.Assigned()
	return nil
}

func (h groupHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h groupHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			h.r.Consumed(m.Value, m.Partition, m.Offset)
			sess.MarkMessage(m, "")
		case <-sess.Context().Done():
			return nil
		}
	}
}

// consumeGroup subscribes as a member of --group; sarama commits marked offsets
// every Consumer.Offsets.AutoCommit.Interval and when the group is closed.
func (d *driver) consumeGroup(ctx context.Context, r *labdriver.Run) {
	a := d.args
	var group sarama.ConsumerGroup
	if !retryUntil(ctx, "NewConsumerGroup", func() (err error) {
		group, err = sarama.NewConsumerGroup(a.Bootstrap, a.Group, d.cfg)
		return err
	}) {
		return
	}
	go func() {
		for err := range group.Errors() {
			sarama.Logger.Printf("labdriver: consumer group error: %v", err)
		}
	}()
	for ctx.Err() == nil {
		if err := group.Consume(ctx, []string{a.Topic}, groupHandler{r}); err != nil {
			sarama.Logger.Printf("labdriver: Consume: %v", err)
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	if err := group.Close(); err != nil {
		sarama.Logger.Printf("labdriver: closing the group: %v", err)
	}
}
