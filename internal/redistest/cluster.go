package redistest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	// clusterMasters is the number of masters in a private cluster.
	clusterMasters = 3
	// clusterSlots is the number of hash slots in a Redis Cluster.
	clusterSlots = 16384
	// clusterTimeout bounds forming a private cluster, once its nodes run.
	clusterTimeout = 20 * time.Second
	// clusterPollInterval is the pause between checks of the cluster's state.
	clusterPollInterval = 20 * time.Millisecond
)

// Cluster returns the seed addresses (host:port) of a Redis Cluster for this test.
//
// If REDIS_CLUSTER_ADDRS is set (comma-separated addresses), Cluster returns them;
// that cluster is shared, so the caller must use unique key prefixes. Otherwise it
// starts a private cluster for this call, as [StartCluster] does, and returns the
// addresses of its nodes. Any of the addresses works as a seed for a cluster client.
//
// Without a redis-server binary on PATH, Cluster skips the test, or fails it when
// CI is set.
func Cluster(tb testing.TB) []string {
	tb.Helper()
	s := resolve(tb, EnvClusterAddrs)
	if s.external != nil {
		return s.external
	}
	nodes := startCluster(tb, s.binary)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// StartCluster starts a private Redis Cluster of three masters without replicas on
// free loopback ports, each master serving a third of the hash slots, and returns
// its nodes once every node reports cluster_state:ok with all 16384 slots assigned
// to three masters it knows. Start-up takes about 2 s, because a Redis master
// waits 2 s after starting before it declares the cluster ok. It ignores
// REDIS_CLUSTER_ADDRS, because fault tests stop the nodes they get. The nodes are
// stopped when the test and its subtests have finished.
//
// A stopped node that is restarted rejoins the cluster with its slots (its
// nodes.conf survives), but loses its data. With no replicas, the slots of a
// stopped node are unavailable and the cluster state turns to fail after the
// 5-second node timeout.
//
// Without a redis-server binary on PATH, StartCluster skips the test, or fails it
// when CI is set.
func StartCluster(tb testing.TB) []*Process {
	tb.Helper()
	s := resolve(tb, "")
	return startCluster(tb, s.binary)
}

// startCluster starts the nodes and forms the cluster, failing tb on error.
func startCluster(tb testing.TB, bin string) []*Process {
	tb.Helper()
	nodes := make([]*Process, clusterMasters)
	for i := range nodes {
		nodes[i] = startProcess(tb, bin, true)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := formCluster(ctx, nodes); err != nil {
		tb.Fatalf("redistest: forming cluster: %v", err)
	}
	return nodes
}

// formCluster turns freshly started, empty cluster-mode nodes into one cluster
// much as redis-cli --cluster create does, without needing redis-cli: distinct
// config epochs, a contiguous share of the slots for each node, CLUSTER MEET
// between every pair, then waiting until every node sees the whole cluster.
func formCluster(ctx context.Context, nodes []*Process) error {
	for i, n := range nodes {
		// Distinct epochs up front avoid a round of epoch-collision resolution.
		if _, err := Exec(ctx, n.Addr(), "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1)); err != nil {
			return fmt.Errorf("%s: CLUSTER SET-CONFIG-EPOCH: %w", n.Addr(), err)
		}
		lo, hi := slotRange(i, len(nodes))
		if err := addSlots(ctx, n.Addr(), lo, hi); err != nil {
			return err
		}
	}
	// Every pair meets directly: learning of a node only through gossip can take
	// half the node timeout.
	for i, a := range nodes {
		for _, b := range nodes[i+1:] {
			if _, err := Exec(ctx, a.Addr(), "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(b.Port())); err != nil {
				return fmt.Errorf("%s: CLUSTER MEET %s: %w", a.Addr(), b.Addr(), err)
			}
		}
	}
	for {
		err := clusterReady(ctx, nodes)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready within %v: %w", clusterTimeout, err)
		case <-time.After(clusterPollInterval):
		}
	}
}

// slotRange returns the first and last slot of node i's share of the slots.
func slotRange(i, n int) (lo, hi int) {
	return i * clusterSlots / n, (i+1)*clusterSlots/n - 1
}

// addSlots assigns slots lo..hi to the node at addr, with CLUSTER ADDSLOTSRANGE
// (Redis 7) or, on older servers, CLUSTER ADDSLOTS.
func addSlots(ctx context.Context, addr string, lo, hi int) error {
	_, err := Exec(ctx, addr, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi))
	var e ReplyError
	if errors.As(err, &e) && strings.Contains(strings.ToLower(string(e)), "unknown subcommand") {
		args := []string{"CLUSTER", "ADDSLOTS"}
		for s := lo; s <= hi; s++ {
			args = append(args, strconv.Itoa(s))
		}
		_, err = Exec(ctx, addr, args...)
	}
	if err != nil {
		return fmt.Errorf("%s: assigning slots %d-%d: %w", addr, lo, hi, err)
	}
	return nil
}

// clusterReady returns nil once every node reports the cluster ok, all slots
// assigned, and exactly the expected masters, each serving slots; otherwise it
// describes the first node that is not there yet.
func clusterReady(ctx context.Context, nodes []*Process) error {
	want := [][2]string{
		{"cluster_state", "ok"},
		{"cluster_slots_assigned", strconv.Itoa(clusterSlots)},
		{"cluster_known_nodes", strconv.Itoa(len(nodes))},
		{"cluster_size", strconv.Itoa(len(nodes))}, // masters serving slots
	}
	for _, n := range nodes {
		reply, err := Exec(ctx, n.Addr(), "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", n.Addr(), err)
		}
		s, _ := reply.(string)
		info := ParseInfo(s)
		for _, kv := range want {
			if k, v := kv[0], kv[1]; info[k] != v {
				return fmt.Errorf("%s: %s is %q, want %q", n.Addr(), k, info[k], v)
			}
		}
	}
	return nil
}
