package e2e

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// revertThrough asks the manager at apiAddr to revert volume to snapshot
// as the admin; it returns the status code, or the error of a request
// that got no answer (the manager died under it).
func revertThrough(apiAddr, volume, snapshot string, client *http.Client) (int, string, error) {
	body := fmt.Sprintf(`{"snapshot":%q}`, snapshot)
	req, err := http.NewRequest(http.MethodPost, "https://"+apiAddr+"/v1/volumes/"+volume+"?action=revert", bytes.NewBufferString(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+env.cluster.AdminConfig.BearerToken)
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// revertTicket is the ID of a revert's ticket on the volume (a strata-api
// ticket without frontend); "" when there is none.
func revertTicket(t *testing.T, volume string) string {
	for id, tk := range getVA(t, volume).Spec.AttachmentTickets {
		if tk.Type == v1beta1.AttacherTypeStrataAPI && tk.Parameters[v1beta1.AttachmentParameterDisableFrontend] == "true" {
			return id
		}
	}
	return ""
}

// A manager killed with SIGKILL in the middle of a revert it serves
// through the REST API: the revert's ticket would hold the volume until
// its Lease lapsed (5 minutes), refusing the user's retry with 409. The
// manager releases it when it starts again, the volume detaches, the retry
// succeeds and the volume reads the snapshot's data.
func TestRESTRevertSurvivesAKilledManager(t *testing.T) {
	const vol, snap, server = "e2e-revert-kill", "e2e-revert-kill-s1", "node-2"
	createVolume(t, vol, "16Mi", 1)
	t.Cleanup(func() { deleteVolume(t, vol) })
	useOn(t, vol, "node-1", "write -P 0x11 0 1M")
	createSnapshot(t, vol, snap)
	waitSnapshotsReady(t, vol, 1, 2*time.Minute)
	useOn(t, vol, "node-1", "write -P 0x22 0 1M")

	apiAddr := getNode(t, server).Status.APIAddress
	require.NotEmpty(t, apiAddr)
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: caBundlePool(t), MinVersion: tls.VersionTLS12}}}
	t.Cleanup(func() {
		if env.managers[server].Exited() {
			if m, err := env.managers[server].Restart(env.managerOpts); err == nil {
				env.managers[server] = m
			}
		}
	})

	// The kill must land while the revert runs (it takes about 0.3 s): the
	// manager is killed as soon as the revert's ticket appears. Should the
	// revert have ended first, that attempt proves nothing and another is
	// made.
	var ticket string
	for attempt := 1; ticket == "" && attempt <= 5; attempt++ {
		answered := make(chan int, 1) // the status code; 0: no answer
		go func() {
			code, _, err := revertThrough(apiAddr, vol, snap, client)
			if err != nil {
				code = 0
			}
			answered <- code
		}()
		require.Eventually(t, func() bool { ticket = revertTicket(t, vol); return ticket != "" },
			time.Minute, 5*time.Millisecond, "the revert's ticket")
		require.NoError(t, env.managers[server].Kill())
		code := <-answered
		t.Logf("attempt %d: manager killed while ticket %s held the volume; the client got status %d (0: none)", attempt, ticket, code)
		m, err := env.managers[server].Restart(env.managerOpts)
		require.NoError(t, err)
		env.managers[server] = m
		if code != 0 {
			ticket = "" // the revert was answered before the kill: no proof, again
			waitVolume(t, vol, time.Minute, "detached", isDetached)
		}
	}
	require.NotEmpty(t, ticket, "a kill landed in the middle of a revert")

	restarted := time.Now()
	require.Eventually(t, func() bool {
		_, held := getVA(t, vol).Spec.AttachmentTickets[ticket]
		return !held
	}, time.Minute, 100*time.Millisecond, "the restarted manager releases the revert's ticket")
	waitVolume(t, vol, time.Minute, "detached", isDetached)
	t.Logf("the killed revert's ticket was gone %s after the manager restarted (its Lease would have lasted 5 min)",
		time.Since(restarted).Round(time.Millisecond))

	var code int
	var body string
	// A restarted manager's cache can still hold the volume on its way
	// down for a moment: a 409 naming a passing state is retried, as a
	// client would; any other answer is the verdict.
	passing := func(body string) bool {
		return strings.Contains(body, "it is attaching") || strings.Contains(body, "it is detaching")
	}
	require.Eventually(t, func() bool {
		var err error
		code, body, err = revertThrough(getNode(t, server).Status.APIAddress, vol, snap, client)
		return err == nil && code != http.StatusServiceUnavailable && !(code == http.StatusConflict && passing(body))
	}, time.Minute, 250*time.Millisecond, "the restarted manager serves the API")
	require.Equal(t, http.StatusOK, code, body)
	useOn(t, vol, "node-1", "read -P 0x11 0 1M")
	assert.Len(t, snapshotsOf(t, vol), 1, "the snapshot is kept")
}
