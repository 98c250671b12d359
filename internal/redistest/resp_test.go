package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestReadReply(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    any
		wantErr error
	}{
		{name: "simple string", in: "+PONG\r\n", want: "PONG"},
		{name: "error", in: "-ERR unknown command\r\n", want: ReplyError("ERR unknown command")},
		{name: "integer", in: ":-42\r\n", want: int64(-42)},
		{name: "bulk string", in: "$5\r\nhe\r\no\r\n", want: "he\r\no"},
		{name: "empty bulk string", in: "$0\r\n\r\n", want: ""},
		{name: "nil bulk string", in: "$-1\r\n", want: nil},
		{name: "nil array", in: "*-1\r\n", want: nil},
		{name: "empty array", in: "*0\r\n", want: []any{}},
		{
			name: "nested array",
			in:   "*3\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$-1\r\n",
			want: []any{int64(0), int64(5460), []any{"127.0.0.1", int64(7000), nil}},
		},
		{name: "error element", in: "*2\r\n+OK\r\n-NOSCRIPT x\r\n", want: []any{"OK", ReplyError("NOSCRIPT x")}},
		{name: "bad type byte", in: "!5\r\n", wantErr: errProtocol},
		{name: "bad integer", in: ":x\r\n", wantErr: errProtocol},
		{name: "bad bulk length", in: "$-2\r\n", wantErr: errProtocol},
		{name: "bulk without CRLF", in: "$2\r\nabcd", wantErr: errProtocol},
		{name: "line without CR", in: "+OK\n", wantErr: errProtocol},
		{name: "empty line", in: "\r\n", wantErr: errProtocol},
		{name: "truncated bulk", in: "$5\r\nab", wantErr: io.ErrUnexpectedEOF},
		{name: "truncated array", in: "*2\r\n+OK\r\n", wantErr: io.EOF},
		{name: "truncated line", in: "+OK", wantErr: io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readReply(bufio.NewReader(strings.NewReader(tt.in)))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("readReply(%q) error = %v, want %v", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("readReply(%q): %v", tt.in, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("readReply(%q) = %#v, want %#v", tt.in, got, tt.want)
			}
		})
	}
}

func TestEncodeCommand(t *testing.T) {
	got := string(encodeCommand([]string{"SET", "k", "", "a\r\nb"}))
	want := "*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n$4\r\na\r\nb\r\n"
	if got != want {
		t.Errorf("encodeCommand = %q, want %q", got, want)
	}
}

func TestReplyText(t *testing.T) {
	tests := []struct {
		in   any
		want string
	}{
		{nil, ""},
		{"OK", "OK"},
		{int64(7), "7"},
		{ReplyError("ERR x"), "ERR x"},
		{[]any{"a", int64(1), nil, []any{"b", "c"}}, "a\n1\n\nb\nc"},
	}
	for _, tt := range tests {
		if got := replyText(tt.in); got != tt.want {
			t.Errorf("replyText(%#v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseInfo(t *testing.T) {
	in := "# Server\r\nredis_version:7.0.15\r\nprocess_id:42\r\n\r\n# Cluster\r\ncluster_enabled:1\r\nexecutable:/usr/bin/redis-server\r\n"
	got := ParseInfo(in)
	want := map[string]string{
		"redis_version":   "7.0.15",
		"process_id":      "42",
		"cluster_enabled": "1",
		"executable":      "/usr/bin/redis-server",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseInfo = %v, want %v", got, want)
	}
}

// fakeServer serves conn with handle on a loopback listener and returns its address.
func fakeServer(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return l.Addr().String()
}

func TestExec(t *testing.T) {
	addr := fakeServer(t, func(c net.Conn) {
		r := bufio.NewReader(c)
		cmd, err := readReply(r)
		if err != nil {
			return
		}
		switch fmt.Sprint(cmd) {
		case "[ECHO hi]":
			io.WriteString(c, "$2\r\nhi\r\n")
		case "[BAD]":
			io.WriteString(c, "-ERR bad\r\n")
		case "[HANG]":
			io.Copy(io.Discard, r) // never reply
		}
	})
	ctx := t.Context()
	if got, err := Exec(ctx, addr, "ECHO", "hi"); err != nil || got != "hi" {
		t.Errorf("Exec ECHO = %v, %v, want hi", got, err)
	}
	_, err := Exec(ctx, addr, "BAD")
	var re ReplyError
	if !errors.As(err, &re) || re != "ERR bad" {
		t.Errorf("Exec BAD error = %v, want ReplyError(ERR bad)", err)
	}
	if _, err := Exec(ctx, addr); err == nil {
		t.Error("Exec with no args succeeded, want error")
	}

	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := Exec(tctx, addr, "HANG"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Exec HANG with deadline error = %v, want DeadlineExceeded", err)
	}
	cctx, cancel2 := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel2)
	if _, err := Exec(cctx, addr, "HANG"); !errors.Is(err, context.Canceled) {
		t.Errorf("Exec HANG with cancel error = %v, want Canceled", err)
	}
}
