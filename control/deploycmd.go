package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/edgeplane/edgeplane/control/deploy"
	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/control/manifest"
	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/control/status"
	"github.com/edgeplane/edgeplane/store"
)

// addApplyFlags registers the flags of the commands that run an apply.
func addApplyFlags(fs *flag.FlagSet) *deploy.Options {
	opts := &deploy.Options{}
	fs.DurationVar(&opts.LeaseTTL, "lease-ttl", 10*time.Second, "TTL of the namespace deploy lease (renewed while held)")
	fs.DurationVar(&opts.ProbeTimeout, "probe-timeout", 2*time.Second, "how long each machine has to answer the capacity probe")
	fs.DurationVar(&opts.GatewayWait, "gateway-wait", 10*time.Second, "bound on waiting for gateways to apply the new routing")
	fs.DurationVar(&opts.DrainGrace, "drain-grace", 2*time.Second, "pause before stopping old instances, for requests in flight")
	fs.DurationVar(&opts.StopGrace, "stop-grace", 10*time.Second, "SIGTERM-to-SIGKILL grace for old instances")
	fs.DurationVar(&opts.RPCTimeout, "rpc-timeout", 10*time.Second, "bound on each machine call beyond its own wait; a machine with candidates that stops answering fails the apply within about this")
	return opts
}

// addManifestFlag registers -f; read reads and validates the manifest it
// names, so that an invalid one fails before anything connects or writes.
func addManifestFlag(fs *flag.FlagSet) (read func() (*store.Manifest, error)) {
	file := fs.String("f", "", "manifest file, YAML or JSON (required)")
	return func() (*store.Manifest, error) {
		if *file == "" {
			return nil, usagef("-f FILE is required")
		}
		m, err := manifest.ReadFile(*file)
		if me, ok := err.(*manifest.Error); ok {
			return nil, me.Structured()
		}
		return m, err
	}
}

// withDeployer binds to the store for as long as fn runs, with a Deployer
// that prints its progress on stdout (unless the output is JSON).
func (c *call) withDeployer(opts deploy.Options, fn func(*deploy.Deployer) error) error {
	if !c.out.json {
		opts.Out = c.stdout
	}
	return c.withStore(func(s *store.Store) error { return fn(deploy.New(s, opts)) })
}

func setupDeployPreview(fs *flag.FlagSet) func(*call) error {
	read := addManifestFlag(fs)
	return func(c *call) error {
		m, err := read()
		if err != nil {
			return err
		}
		return c.withDeployer(deploy.Options{}, func(d *deploy.Deployer) error {
			p, err := d.Preview(c.ctx, m)
			if err != nil && p == nil {
				return err
			}
			if perr := c.out.emit(p, func(w io.Writer) { printers.Plan(w, p) }); perr != nil {
				return perr
			}
			return err
		})
	}
}

func setupDeployApply(fs *flag.FlagSet) func(*call) error {
	read := addManifestFlag(fs)
	opts := addApplyFlags(fs)
	return func(c *call) error {
		m, err := read()
		if err != nil {
			return err
		}
		return c.withDeployer(*opts, func(d *deploy.Deployer) error {
			st, err := d.Apply(c.ctx, m)
			return finishApply(c.out, st, err)
		})
	}
}

func setupDeployRollback(fs *flag.FlagSet) func(*call) error {
	to := fs.String("to", "", "deploy ID of the commit to roll back to (default: the one before the live commit)")
	opts := addApplyFlags(fs)
	return func(c *call) error {
		return c.withDeployer(*opts, func(d *deploy.Deployer) error {
			st, err := d.Rollback(c.ctx, c.args[0], *to)
			return finishApply(c.out, st, err)
		})
	}
}

func setupDeployDestroy(fs *flag.FlagSet) func(*call) error {
	opts := addApplyFlags(fs)
	return func(c *call) error {
		return c.withDeployer(*opts, func(d *deploy.Deployer) error {
			st, err := d.Destroy(c.ctx, c.args[0])
			return finishApply(c.out, st, err)
		})
	}
}

func setupCanaryDecision(action string) func(*flag.FlagSet) func(*call) error {
	return func(*flag.FlagSet) func(*call) error {
		return func(c *call) error {
			return c.withDeployer(deploy.Options{}, func(d *deploy.Deployer) error {
				st, err := d.DecideCanary(c.ctx, c.args[0], action)
				if err != nil {
					return err
				}
				return c.out.emit(st, func(w io.Writer) {
					fmt.Fprintf(w, "%s of the canary of deploy %s (revision %d) recorded; the apply holding it acts within %s (the control plane, if its orchestrator is gone)\n",
						action, st.DeployID, st.Revision, deploy.CanaryPoll)
				})
			})
		}
	}
}

func setupDeployStatus(*flag.FlagSet) func(*call) error {
	return storeAnswer(func(c *call, s *store.Store) (status.Deploys, error) {
		return status.ReadDeploys(c.ctx, s, deploy.New(s, deploy.Options{}), c.args)
	})
}

func setupDeployHistory(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withDeployer(deploy.Options{}, func(d *deploy.Deployer) error {
			hist, refused, err := d.History(c.ctx, c.args[0])
			if err != nil {
				return err
			}
			// Commits nobody trusted signed are not history: say so
			// beside it.
			for _, r := range refused {
				fmt.Fprintf(c.stderr, "warning: left out: %v\n", r)
			}
			if hist == nil {
				hist = []store.DeployCommit{}
			}
			return c.out.emit(hist, func(w io.Writer) { printers.History(w, hist) })
		})
	}
}

func finishApply(out *output, st *store.DeployStatus, err error) error {
	if out.json && st != nil {
		if perr := out.emit(st, nil); perr != nil {
			return perr
		}
	}
	if err != nil {
		return err
	}
	if !out.json {
		printers.Applied(out.w, st)
	}
	return nil
}

func setupInstances(fs *flag.FlagSet) func(*call) error {
	ns := fs.String("namespace", "", "only this namespace")
	return storeAnswer(func(c *call, s *store.Store) (status.Instances, error) { return status.ReadInstances(c.ctx, s, *ns) })
}

// setupInstanceCommand is `instance restart` and `instance stop`: a leased
// command to the machine that runs the instance. Its attempt
// number is the time in milliseconds, so a later command always wins over
// an earlier one still in flight.
func setupInstanceCommand(command string) func(*flag.FlagSet) func(*call) error {
	return func(fs *flag.FlagSet) func(*call) error {
		grace := fs.Duration("stop-grace", 10*time.Second, "SIGTERM-to-SIGKILL grace")
		timeout := fs.Duration("wait", 2*time.Minute, "how long the machine has to finish (a restart waits for readiness)")
		machine := fs.String("machine", "", "the machine running an instance the store has no record of (control doctor names them): it is asked what it runs")
		return func(c *call) error {
			return c.withStore(func(s *store.Store) error {
				rec, err := status.FindInstance(c.ctx, s, c.args[0])
				if store.HasCode(err, store.CodeNotFound) && *machine != "" {
					rec, err = machines.RunningInstance(c.ctx, s, *machine, c.args[0])
				}
				if err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(c.ctx, *timeout)
				defer cancel()
				var rep store.LeasedReply
				err = s.Call(ctx, rec.Machine, command, store.LeasedCommand{InstanceID: rec.ID, Namespace: rec.Namespace, Service: rec.Service,
					Attempt: int(time.Now().UnixMilli()), Grace: store.Duration(*grace)}, &rep)
				if err != nil {
					return err
				}
				return c.out.emit(rep, func(w io.Writer) {
					fmt.Fprintf(w, "instance %s (%s/%s) on %s: %s\n", rec.ID, rec.Namespace, rec.Service, rec.Machine, rep.Detail)
				})
			})
		}
	}
}

func setupHashPassword(fs *flag.FlagSet) func(*call) error {
	alg := fs.String("algorithm", "bcrypt", "bcrypt (cost 14) or argon2id (t=1, m=46 MiB, p=1), as Caddy hashes by default")
	return func(c *call) error { return manifest.HashPasswordCommand(*alg, c.stdout, c.stderr) }
}
