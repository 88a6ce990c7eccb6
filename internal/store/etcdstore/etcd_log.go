package etcdstore

import (
	"context"
	"log/slog"
	"slices"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newEtcdClientLogger passes the etcd client's zap logging to slog. The
// client warns about every RPC it retries, including reads that the store
// expects to fail (a compacted snapshot, a cancelled context) and handles
// itself, so its warnings become debug messages; its errors stay errors.
func newEtcdClientLogger(log *slog.Logger) *zap.Logger {
	return zap.New(&slogCore{log: log.With("component", "etcd-client")})
}

// slogCore is a zapcore.Core writing to a slog.Logger.
type slogCore struct {
	log    *slog.Logger
	fields []zapcore.Field
}

func (c *slogCore) Enabled(level zapcore.Level) bool { return level >= zapcore.WarnLevel }

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, fields: append(slices.Clip(c.fields), fields...)}
}

func (c *slogCore) Check(entry zapcore.Entry, checked *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(entry.Level) {
		return checked.AddCore(entry, c)
	}
	return checked
}

func (c *slogCore) Write(entry zapcore.Entry, fields []zapcore.Field) error {
	level := slog.LevelDebug
	if entry.Level >= zapcore.ErrorLevel {
		level = slog.LevelError
	}
	ctx := context.Background()
	if !c.log.Enabled(ctx, level) {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields))
	for k, v := range enc.Fields {
		attrs = append(attrs, slog.Any(k, v))
	}
	slices.SortFunc(attrs, func(a, b slog.Attr) int { return strings.Compare(a.Key, b.Key) })
	c.log.LogAttrs(ctx, level, entry.Message, attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }
