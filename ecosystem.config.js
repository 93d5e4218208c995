// pm2 processes of the QUASAR suite: `pm2 start ecosystem.config.js` starts them all, or name one:
//   pm2 start ecosystem.config.js --only quasar-miner
// A miner runs quasar-miner-inference and quasar-miner; a validator runs quasar-validator; the
// subnet owner runs quasar-api. Settings come from .env in this folder (see .env.example).
// Wallets: the miner and its inference server load WALLET_MINER_NAME, the validator
// WALLET_VALIDATOR_NAME (or WALLET_NAME for both), each with WALLET_HOTKEY under WALLET_PATH; set them
// in .env, or give one app its own flags, e.g.
//   args: ["--wallet.name", "my_coldkey", "--wallet.hotkey", "my_hotkey"],
// On one host with several GPUs, give each app its own GPUs (nvidia-smi's numbers or UUIDs; a .env
// here is every app's), e.g. env: { CUDA_VISIBLE_DEVICES: "2,3" } for quasar-validator and
// env: { CUDA_VISIBLE_DEVICES: "0" } for both miner apps (docs/validator.md, "Which GPUs").
// pm2 appends to its log files (~/.pm2/logs) without end: `pm2 install pm2-logrotate` once per host.
// Each script is named relative to cwd, this folder: pm2 runs a script whose name has a space as
// the command line `bash -c SCRIPT`, so a checkout in "~/GPU work" restarted without end on
// "/usr/bin/bash: cannot execute binary file".
const common = {
  cwd: __dirname,
  interpreter: "bash",
  autorestart: true,
  // A crash restarts after 1 s, and each further one (unless the app stayed up 30 s) waits 1.5 times
  // longer, up to pm2's cap of 15 s: a transient crash comes back at once, a crash loop (a missing
  // wallet, a bad .env) does not spin. No restart_delay beside it: pm2 ignores it then.
  exp_backoff_restart_delay: 1000,
  kill_timeout: 30000,
  // No `time: true`: each line the processes log opens with its time already.
};

module.exports = {
  apps: [
    {
      ...common,
      name: "quasar-api",
      script: "START_SERVER.sh",
    },
    {
      ...common,
      name: "quasar-miner-inference",
      script: "START_MINER_INFERENCE.sh",
    },
    {
      ...common,
      name: "quasar-miner",
      script: "START_MINER.sh",
    },
    {
      ...common,
      name: "quasar-validator",
      script: "START_VALIDATOR.sh",
    },
  ],
};
