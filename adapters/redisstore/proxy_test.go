package redisstore

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxy is a TCP proxy between go-redis and a Redis server, for fault
// tests: it can delay every reply, and it can cut a connection right after
// the server has answered a script (the script ran; the client sees EOF).
type proxy struct {
	ln      net.Listener
	target  string
	delay   atomic.Int64 // nanoseconds added before each reply chunk
	cut     atomic.Bool  // cut connections after a script's reply
	cutOnce atomic.Bool  // cut the next connection after a script's reply
	cuts    atomic.Int64 // connections cut so far

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *proxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.track(c)
		p.track(s)
		var scripted atomic.Bool // a script was sent on this connection
		p.wg.Add(2)
		go func() { // client to server
			defer p.wg.Done()
			defer s.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					lower := bytes.ToLower(buf[:n])
					if bytes.Contains(lower, []byte("evalsha")) || bytes.Contains(lower, []byte("\r\neval\r\n")) {
						scripted.Store(true)
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // server to client
			defer p.wg.Done()
			defer c.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if d := time.Duration(p.delay.Load()); d > 0 {
						time.Sleep(d)
					}
					if scripted.Load() && (p.cut.Load() || p.cutOnce.CompareAndSwap(true, false)) {
						// The server ran the script and answered; the client
						// never hears it.
						p.cuts.Add(1)
						c.Close()
						s.Close()
						return
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}
