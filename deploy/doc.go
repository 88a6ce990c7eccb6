// Package deploy holds the deployment artefacts of the control plane: a
// systemd unit (systemd/), a container image definition (Dockerfile) and
// Kubernetes manifests as a kustomize base (kubernetes/base), and the
// example of three replicas on a three-member etcd (etcd-cluster/: a
// kustomize overlay of the base, and systemd units). It has no
// code; its test parses the artefacts and checks them against the real
// binary: every flag they pass exists and parses, the ports agree with the
// server's, and the health path they probe answers.
package deploy
