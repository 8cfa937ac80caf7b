package config

// FairnessConfig shares one replica between principals (package fairness):
// each principal's requests are limited in rate and in how many it has in
// progress at once, so that one principal's flood is refused at the door
// and leaves the replica's API client, wait permits and CPU to the others.
//
// The defaults are sized so that one well-behaved principal never meets
// them: DeerFlow's backend sends a create per thread and a few reads, and
// the heaviest single-key load the tests and benchmarks drive (1,000
// creates at concurrency 32, about 60 a second on their cluster) stays
// under 100 requests a second and 64 at once. One principal at that rate,
// a create being two API calls, uses the replica's whole K8S_CLIENT_QPS
// (200): a deployment whose tenants must not slow one another lowers it.
type FairnessConfig struct {
	PrincipalRequestsPerSecond     float64 `envconfig:"PRINCIPAL_REQUESTS_PER_SECOND" default:"100"`
	PrincipalRequestBurst          int     `envconfig:"PRINCIPAL_REQUEST_BURST" default:"200"`
	PrincipalMaxConcurrentRequests int     `envconfig:"PRINCIPAL_MAX_CONCURRENT_REQUESTS" default:"64"`
}

// Validate checks that every limit admits something: a limit of 0 would
// refuse every request, and no limit at all is not offered (a key that
// leaks could then take the replica).
func (c *FairnessConfig) Validate() error {
	var p problems
	if c.PrincipalRequestsPerSecond <= 0 {
		p.bad("PRINCIPAL_REQUESTS_PER_SECOND", "%v must be positive", c.PrincipalRequestsPerSecond)
	}
	if c.PrincipalRequestBurst < 1 {
		p.bad("PRINCIPAL_REQUEST_BURST", "%d must be at least 1", c.PrincipalRequestBurst)
	}
	if c.PrincipalMaxConcurrentRequests < 1 {
		p.bad("PRINCIPAL_MAX_CONCURRENT_REQUESTS", "%d must be at least 1", c.PrincipalMaxConcurrentRequests)
	}
	return p.err()
}
