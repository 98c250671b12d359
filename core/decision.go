package core

import "time"

// Decision is the outcome of one request against one policy.
type Decision struct {
	// Allowed reports whether the policy admits the request. In a batch
	// (see Store), the batch is admitted only when every Decision in it is
	// Allowed; when it is not, nothing is charged and the Remaining of the
	// Allowed decisions is reported without their cost.
	Allowed bool

	// Fallback reports that the store's fallback decided the request in
	// its place, its own backend being unavailable (a Redis store's
	// Config.Fallback), and charged it there if the batch was admitted. A
	// refund of that charge must then go to the fallback: Request.Fallback
	// says so to the store's Refund.
	Fallback bool

	// Limit is the policy's capacity: the most units that can be
	// available at once, and the upper bound of Remaining.
	Limit int64

	// Remaining is the number of units that could be admitted immediately
	// after this decision. It is within [0, Limit].
	Remaining int64

	// ResetAfter is the time until the quota is whole again (Remaining
	// equal to Limit) if no further request arrives; 0 when it already is.
	ResetAfter time.Duration

	// RetryAfter is, for a refused request, the time after which the same
	// request (same cost) would be admitted if nothing else arrived. It is
	// never early. It is 0 when Allowed, and 0 for a request whose cost
	// exceeds the capacity (it can never be admitted).
	RetryAfter time.Duration

	// Delay is, for an admitted request of a shaping LeakyBucket (one with
	// MaxDelay), how long the caller must hold the request before serving
	// it. It is 0 otherwise.
	Delay time.Duration

	// Policy is the policy that made the decision.
	Policy *Policy

	// At is the time the store decided at when it decides on a clock of
	// its own instead of the time it is given (a Redis store on the
	// server's clock: the server's reading, to the microsecond), and zero
	// when it decided at the time it was given, as the in-memory store
	// does. A refund names a charge by the time of the clock that decided
	// it (Request.ChargedAt, from Policy.ChargeStart, which reads At), so
	// that the store finds the charge on that clock.
	At time.Time
}
