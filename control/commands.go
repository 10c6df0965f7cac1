package main

import "github.com/edgeplane/edgeplane/store"

// commands is control's command line, in the order the usage lists it.
var commands = []command{
	{name: "server", synopsis: "--data DIR", summary: "run the control plane: embedded NATS (or --nats), registrar, STUN; with --agent this box's agent too",
		setup: setupServer},
	{name: "agent", synopsis: "--data DIR [--join TOKEN]", summary: "run this machine's agent: answer the orchestrator's RPCs, run instances",
		client: serves, setup: setupAgent},

	{name: "machine invite", summary: "print an invite token for a new machine",
		client: writes, setup: setupMachineInvite},
	{name: "machine ls", aliases: []string{"machine list"}, summary: "list machines, probing each for reachability and instances",
		client: reads, setup: setupMachineList},
	{name: "machine drain", synopsis: "ID", summary: "keep a machine's instances but place nothing new on it",
		client: writes, minArgs: 1, maxArgs: 1, setup: setupMachineState(store.MachineDraining)},
	{name: "machine disable", synopsis: "ID", summary: "take a machine out of placement entirely",
		client: writes, minArgs: 1, maxArgs: 1, setup: setupMachineState(store.MachineDisabled)},
	{name: "machine enable", synopsis: "ID", summary: "put a drained or disabled machine back into placement",
		client: writes, minArgs: 1, maxArgs: 1, setup: setupMachineState(store.MachineActive)},
	{name: "machine rm", aliases: []string{"machine remove"}, synopsis: "ID [--force]", summary: "retire a machine: records, routing, DNS name, mesh peer and invite go",
		client: writes, minArgs: 1, maxArgs: 1, setup: setupMachineRemove},

	{name: "deploy preview", synopsis: "-f FILE", summary: "show what applying a manifest would start, keep and stop; writes nothing",
		client: reads, setup: setupDeployPreview},
	{name: "deploy apply", synopsis: "-f FILE", summary: "apply a manifest: the nine-step deploy, printing each step",
		client: writes, setup: setupDeployApply},
	{name: "deploy status", synopsis: "[NS...]", summary: "live commit, latest deploy and its phase records, per namespace",
		client: reads, maxArgs: -1, setup: setupDeployStatus},
	{name: "deploy history", synopsis: "NS", summary: "a namespace's final commits",
		client: reads, minArgs: 1, maxArgs: 1, setup: setupDeployHistory},
	{name: "deploy rollback", synopsis: "NS [--to ID]", summary: "deploy an earlier commit's spec again",
		client: writes, minArgs: 1, maxArgs: 1, setup: setupDeployRollback},
	{name: "deploy destroy", synopsis: "NS", summary: "retire a namespace: stop its instances, remove its routing, release its hosts",
		client: writes, minArgs: 1, maxArgs: 1, setup: setupDeployDestroy},

	{name: "doctor", synopsis: "[--gateway URL] [--dns ADDR]", summary: "read every layer and say where they disagree; exit 0 when coherent",
		client: reads, setup: setupDoctor},

	{name: "instances", synopsis: "[--namespace NS]", summary: "instance records: machine, address, state, error",
		client: reads, setup: setupInstances},
	{name: "instance restart", synopsis: "ID", summary: "restart an instance in place (same address) and wait until it is ready again",
		client: reads, minArgs: 1, maxArgs: 1, setup: setupInstanceCommand(store.CmdRestart)},
	{name: "instance stop", synopsis: "ID", summary: "stop an instance (it stays stopped: out of the routing until the next apply replaces it)",
		client: reads, minArgs: 1, maxArgs: 1, setup: setupInstanceCommand(store.CmdStop)},
	{name: "certs", summary: "certificates: issuer, expiry, last renewal attempt and error",
		client: reads, setup: setupCerts},

	{name: "storage ls", aliases: []string{"storage list"}, summary: "storage nodes, write quorum, meta leader and replica placement",
		client: reads, setup: setupStorageList},
	{name: "storage add", synopsis: "NODE", summary: "grow replicas onto a caught-up storage node",
		client: reads, minArgs: 1, maxArgs: 1, setup: setupStorageAdd},
	{name: "storage remove", synopsis: "NODE", summary: "move replicas and leaders off a storage node",
		client: reads, minArgs: 1, maxArgs: 1, setup: setupStorageRemove},
	{name: "storage forget", synopsis: "NODE --data DIR", summary: "take a removed, stopped node out of the JetStream meta group",
		client: reads, minArgs: 1, maxArgs: 1, setup: setupStorageForget},
	{name: "storage import", synopsis: "--from DIR", summary: "copy a stopped single box's store into the cluster",
		client: writes, setup: setupStorageImport},

	{name: "signing ls", aliases: []string{"signing list"}, summary: "the trust root and the signers it certified, active and retired",
		client: reads, setup: setupSigningList},
	{name: "signing issue", synopsis: "--name NAME --data DIR -o FILE", summary: "certify a new signer for an operator's CLI (on a storage node)",
		client: certifies, setup: setupSigningIssue},
	{name: "signing rotate", synopsis: "--data DIR", summary: "replace a server's signer: a new one now, the old one retired after --grace",
		client: certifies, setup: setupSigningRotate},
	{name: "signing retire", synopsis: "KEY --data DIR", summary: "retire a signer: nothing it signs from now on is applied",
		client: certifies, minArgs: 1, maxArgs: 1, setup: setupSigningRetire},

	{name: "creds issue", synopsis: "--role ROLE --data DIR -o FILE", summary: "issue role-scoped NATS credentials (on a storage node)",
		setup: setupCredsIssue},
	{name: "creds revoke", synopsis: "--user-creds FILE | --user UKEY", summary: "refuse a user's credentials on every storage node from now on",
		client: reads, setup: setupCredsRevoke},
}
