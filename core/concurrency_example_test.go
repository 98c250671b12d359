package core_test

import (
	"context"
	"fmt"

	"github.com/limitry/ratelimit/core"
)

// A SlotTable admits at most Limit requests per key in flight; a slot frees
// when its release function is called.
func ExampleSlotTable() {
	tab := core.NewSlotTable(0)
	req := []core.SlotRequest{{Name: "in-flight", Key: "alice", Limit: 2}}
	var out [1]core.SlotDecision
	for i := 1; i <= 3; i++ {
		release, err := tab.Acquire(context.Background(), req, out[:])
		if err != nil {
			panic(err)
		}
		fmt.Printf("request %d: admitted %v, in flight %d\n", i, release != nil, out[0].InFlight)
		if i == 3 {
			break
		}
		defer release()
	}
	// Output:
	// request 1: admitted true, in flight 1
	// request 2: admitted true, in flight 2
	// request 3: admitted false, in flight 2
}
