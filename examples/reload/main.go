// Command reload serves GET / behind one per-client-IP layer whose rule it
// reads from a JSON file, and reloads the file within a second of a change,
// without a restart and without forgetting who has used what:
//
//	echo '{"per-ip": "5/10m"}' > rules.json
//	go run ./examples/reload -addr 127.0.0.1:8080 -rules rules.json &
//	for i in 1 2 3; do curl -s -o /dev/null -w "%{http_code} limit=%header{x-ratelimit-limit} remaining=%header{x-ratelimit-remaining}\n" http://127.0.0.1:8080/; done
//	echo '{"per-ip": "10/10m"}' > rules.json; sleep 1
//	curl -s -o /dev/null -w "%{http_code} limit=%header{x-ratelimit-limit} remaining=%header{x-ratelimit-remaining}\n" http://127.0.0.1:8080/
//
// prints limit=5 with remaining 4, 3, 2, then limit=10 remaining=6: the
// three earlier requests still count under the new rule. A file that fails
// to parse or validate is reported and changes nothing.
//
// The file maps a layer name to a rate such as "100/min", "5000/h" or
// "1000-H" (see core.ParseRate); this example has one layer, "per-ip".
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/limitry/ratelimit"
	"github.com/limitry/ratelimit/core"
)

// readRules parses the rules file: a JSON object of layer name to rate.
func readRules(data []byte) (map[string]core.Rule, error) {
	var rates map[string]string
	if err := json.Unmarshal(data, &rates); err != nil {
		return nil, fmt.Errorf("rules file: %w", err)
	}
	rules := make(map[string]core.Rule, len(rates))
	for name, rate := range rates {
		r, err := core.ParseRate(rate)
		if err != nil {
			return nil, fmt.Errorf("rules file: layer %q: %w", name, err)
		}
		rules[name] = r.Named(name)
	}
	return rules, nil
}

// server is the example's limiter, handler and the last rules file read.
type server struct {
	limiter *ratelimit.Limiter
	handler http.Handler
	path    string
	last    []byte
}

// newServer builds the server from the rules file at path (clock nil for
// the system clock).
func newServer(path string, clock core.Clock) (*server, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	rules, err := readRules(data)
	if err != nil {
		return nil, err
	}
	ip, ok := rules["per-ip"]
	if !ok {
		return nil, fmt.Errorf("rules file: no rate for layer \"per-ip\"")
	}
	opts := []ratelimit.Option{ratelimit.WithHeaders(ratelimit.AllHeaders)}
	if clock != nil {
		opts = append(opts, ratelimit.WithClock(clock))
	}
	l, err := ratelimit.New([]ratelimit.Layer{{Key: ratelimit.MustClientIP(), Rule: ip}}, opts...)
	if err != nil {
		return nil, err
	}
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))
	return &server{limiter: l, handler: h, path: path, last: data}, nil
}

// reload reads the rules file again and applies it if it changed. It
// reports whether the rules changed.
func (s *server) reload() (bool, error) {
	data, err := os.ReadFile(s.path)
	if err != nil {
		return false, err
	}
	if bytes.Equal(data, s.last) {
		return false, nil
	}
	s.last = data
	rules, err := readRules(data)
	if err != nil {
		return false, err
	}
	if err := s.limiter.SetRules(rules); err != nil {
		return false, err
	}
	return true, nil
}

func main() {
	addr := flag.String("addr", ":8080", "address to listen on")
	path := flag.String("rules", "rules.json", `JSON file mapping a layer name to a rate, e.g. {"per-ip": "5/10m"}`)
	flag.Parse()
	s, err := newServer(*path, nil)
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		for range time.Tick(250 * time.Millisecond) {
			changed, err := s.reload()
			switch {
			case err != nil:
				log.Printf("reload: %v (the rules in force are unchanged)", err)
			case changed:
				log.Printf("reload: rules now %v", s.limiter.Rules()["per-ip"])
			}
		}
	}()
	srv := &http.Server{Addr: *addr, Handler: s.handler, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("reload: serving with rules from %s, checked every 250ms", *path)
	log.Fatal(srv.ListenAndServe())
}
