package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// doTimeout bounds a whole [Do] exchange.
const doTimeout = 10 * time.Second

// ReplyError is an error reply from Redis, without its leading '-', such as
// "ERR unknown command 'FOO'" or "MOVED 3999 127.0.0.1:6381".
type ReplyError string

// Error returns the reply text.
func (e ReplyError) Error() string { return string(e) }

// Do sends one command to the Redis server at addr, as [Exec] does with a
// 10-second limit, and returns its reply as text: simple and bulk strings as they
// are, integers in decimal, nil replies as "", and arrays as their elements' text
// joined by newlines (an error element as its text). It fails tb on an error reply
// or a network failure.
//
// Do suits commands sent from the test goroutine to a server the test controls,
// such as SCRIPT FLUSH, CLIENT KILL, DEBUG SLEEP 0.5 or INFO stats (see
// [ParseInfo]). Use Exec to inspect error replies, for commands that block longer,
// or from other goroutines.
func Do(tb testing.TB, addr string, args ...string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), doTimeout)
	defer cancel()
	reply, err := Exec(ctx, addr, args...)
	if err != nil {
		tb.Fatalf("redistest: %s %s: %v", addr, strings.Join(args, " "), err)
	}
	return replyText(reply)
}

// Exec sends one command to the Redis server at addr on a new connection, which
// it closes before returning, and returns the reply decoded from RESP2:
//
//   - a simple or bulk string as string,
//   - an integer as int64,
//   - a nil bulk string or nil array as nil,
//   - an array as []any holding these same types, an error element as ReplyError.
//
// An error reply is returned as a [ReplyError] error; a network or protocol
// failure, or ctx ending, as another error. ctx bounds the whole exchange. Exec may
// be called from any goroutine.
func Exec(ctx context.Context, addr string, args ...string) (any, error) {
	c, err := dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer c.close()
	return c.do(args...)
}

// ParseInfo parses the text of an INFO or CLUSTER INFO reply into its fields
// ("redis_version:7.0.15" becomes "redis_version" → "7.0.15"), skipping section
// headers and blank lines.
func ParseInfo(s string) map[string]string {
	fields := make(map[string]string)
	for line := range strings.Lines(s) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = v
		}
	}
	return fields
}

// replyText renders a decoded reply as Do documents.
func replyText(reply any) string {
	switch r := reply.(type) {
	case nil:
		return ""
	case string:
		return r
	case int64:
		return strconv.FormatInt(r, 10)
	case ReplyError:
		return string(r)
	case []any:
		parts := make([]string, len(r))
		for i, e := range r {
			parts[i] = replyText(e)
		}
		return strings.Join(parts, "\n")
	default:
		return fmt.Sprint(r)
	}
}

// conn is one RESP connection; it is not safe for concurrent use.
type conn struct {
	ctx  context.Context
	addr string
	nc   net.Conn
	r    *bufio.Reader
	stop func() bool // unregisters the ctx watcher
}

// dial connects to addr; ctx bounds the connection's whole life.
func dial(ctx context.Context, addr string) (*conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(deadline)
	}
	// Unblock reads and writes when ctx is cancelled before its deadline.
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	return &conn{ctx: ctx, addr: addr, nc: nc, r: bufio.NewReader(nc), stop: stop}, nil
}

func (c *conn) close() {
	c.stop()
	_ = c.nc.Close()
}

// do sends one command and reads its reply; an error reply becomes the error.
func (c *conn) do(args ...string) (any, error) {
	if len(args) == 0 {
		return nil, errors.New("redistest: empty command")
	}
	if _, err := c.nc.Write(encodeCommand(args)); err != nil {
		return nil, c.wrap(err)
	}
	reply, err := readReply(c.r)
	if err != nil {
		return nil, c.wrap(err)
	}
	if e, ok := reply.(ReplyError); ok {
		return nil, e
	}
	return reply, nil
}

// wrap adds the address to a network or protocol error, preferring ctx's error
// when ctx has ended, since that is why the connection failed.
func (c *conn) wrap(err error) error {
	if ctxErr := c.ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %w", c.addr, ctxErr)
	}
	// The connection's deadline can fire a moment before ctx reports it.
	if deadline, ok := c.ctx.Deadline(); ok && !time.Now().Before(deadline) {
		return fmt.Errorf("%s: %w", c.addr, context.DeadlineExceeded)
	}
	return fmt.Errorf("%s: %w", c.addr, err)
}

// encodeCommand encodes args as a RESP array of bulk strings.
func encodeCommand(args []string) []byte {
	b := make([]byte, 0, 16*len(args)+8)
	b = fmt.Appendf(b, "*%d\r\n", len(args))
	for _, a := range args {
		b = fmt.Appendf(b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b
}

// errProtocol reports a reply that is not valid RESP2.
var errProtocol = errors.New("redistest: malformed RESP reply")

// Limits that keep a malformed reply from exhausting memory.
const (
	maxBulkLen  = 512 << 20 // Redis's own proto-max-bulk-len default
	maxArrayLen = 1 << 24
)

// readReply reads one RESP2 reply. Error replies, at any depth, are returned as
// ReplyError values, not as errors; errors are network or protocol failures.
func readReply(r *bufio.Reader) (any, error) {
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	if line == "" {
		return nil, fmt.Errorf("%w: empty line", errProtocol)
	}
	kind, rest := line[0], line[1:]
	switch kind {
	case '+':
		return rest, nil
	case '-':
		return ReplyError(rest), nil
	case ':':
		n, err := strconv.ParseInt(rest, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: integer %q", errProtocol, rest)
		}
		return n, nil
	case '$':
		n, err := strconv.Atoi(rest)
		if err != nil || n < -1 || n > maxBulkLen {
			return nil, fmt.Errorf("%w: bulk length %q", errProtocol, rest)
		}
		if n == -1 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		if buf[n] != '\r' || buf[n+1] != '\n' {
			return nil, fmt.Errorf("%w: bulk string not terminated by CRLF", errProtocol)
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(rest)
		if err != nil || n < -1 || n > maxArrayLen {
			return nil, fmt.Errorf("%w: array length %q", errProtocol, rest)
		}
		if n == -1 {
			return nil, nil
		}
		elems := make([]any, 0, min(n, 1024))
		for range n {
			e, err := readReply(r)
			if err != nil {
				return nil, err
			}
			elems = append(elems, e)
		}
		return elems, nil
	default:
		return nil, fmt.Errorf("%w: unexpected type byte %q", errProtocol, kind)
	}
}

// readLine reads one CRLF-terminated line and returns it without the CRLF.
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		if errors.Is(err, io.EOF) && line != "" {
			err = io.ErrUnexpectedEOF
		}
		return "", err
	}
	s, ok := strings.CutSuffix(line, "\r\n")
	if !ok {
		return "", fmt.Errorf("%w: line not terminated by CRLF", errProtocol)
	}
	return s, nil
}
