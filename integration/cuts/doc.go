// Package cuts holds the power-cut tests of issue 38: the product's own
// parts (the deploy flow and its completer against simulated agents,
// machine admission and removal, certificate issuance against Pebble) run
// against storage nodes whose data directories sit on internal/powercut
// mounts; power is cut at seeded random points, the nodes boot again from
// what a disk would hold, and every test checks that nothing the store
// acknowledged before the cut is lost and that what was under way
// converges. The package has tests only; run one at a time as root
// (`go test -count=1 -run TestCuts ./integration/cuts/`), CUTS_SEED=N
// repeats a run.
package cuts
