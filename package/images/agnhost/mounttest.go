package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
	"time"
)

// newFileContent is what mounttest writes into every new file; the subPath
// suite waits for "content of file \"P\": mount-tester new file".
const newFileContent = "mount-tester new file\n"

// tmpfsMagic is statfs' f_type of tmpfs, the one type --fs_type names
// (others are printed as the number).
const tmpfsMagic = 0x01021994

// mounttest runs the file checks its flags ask for, in a fixed order (the
// suites rely on it: a new file is written before its mode is read),
// printing one line per check to out, and returns 1 if any failed. sleep
// paces --file_content_in_loop (a parameter, for the tests).
func mounttest(args []string, out io.Writer, sleep func(time.Duration)) int {
	fs := flag.NewFlagSet("mounttest", flag.ContinueOnError)
	fs.SetOutput(out)
	fsType := fs.String("fs_type", "", "print the filesystem type of this path")
	newFiles := []struct {
		path *string
		perm os.FileMode
	}{
		{fs.String("new_file_0644", "", "write a new file with mode 0644 and print its content"), 0o644},
		{fs.String("new_file_0666", "", "write a new file with mode 0666 and print its content"), 0o666},
		{fs.String("new_file_0660", "", "write a new file with mode 0660 and print its content"), 0o660},
		{fs.String("new_file_0777", "", "write a new file with mode 0777 and print its content"), 0o777},
	}
	mode := fs.String("file_mode", "", "print the mode of this path")
	perm := fs.String("file_perm", "", "print the permission bits of this path")
	owner := fs.String("file_owner", "", "print the owning uid and gid of this path")
	content := fs.String("file_content", "", "print the content of this file")
	loop := fs.String("file_content_in_loop", "", "print this file's content every 2 s until it is the new-file content")
	retry := fs.Int("retry_time", 180, "seconds --file_content_in_loop keeps trying")
	breakOnExpected := fs.Bool("break_on_expected_content", true, "stop --file_content_in_loop once the content is the new-file content")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(out, "mounttest: unexpected arguments %q\n", fs.Args())
		return 2
	}
	// The modes asked for, whatever the container's umask.
	syscall.Umask(0)

	var errs []error
	check := func(path string, f func(string) error) {
		if path != "" {
			errs = append(errs, f(path))
		}
	}
	check(*fsType, func(p string) error {
		var st syscall.Statfs_t
		if err := syscall.Statfs(p, &st); err != nil {
			fmt.Fprintf(out, "error from statfs(%q): %v\n", p, err)
			return err
		}
		name := strconv.FormatInt(int64(st.Type), 10)
		if st.Type == tmpfsMagic {
			name = "tmpfs"
		}
		fmt.Fprintf(out, "mount type of %q: %s\n", p, name)
		return nil
	})
	for _, nf := range newFiles {
		check(*nf.path, func(p string) error {
			if err := os.WriteFile(p, []byte(newFileContent), nf.perm); err != nil {
				fmt.Fprintf(out, "error writing new file %q: %v\n", p, err)
				return err
			}
			return printContent(out, p)
		})
	}
	check(*mode, func(p string) error {
		info, err := os.Stat(p)
		if err != nil {
			fmt.Fprintf(out, "error from Stat(%q): %v\n", p, err)
			return err
		}
		fmt.Fprintf(out, "mode of file %q: %v\n", p, info.Mode())
		return nil
	})
	check(*perm, func(p string) error {
		info, err := os.Stat(p)
		if err != nil {
			fmt.Fprintf(out, "error from Stat(%q): %v\n", p, err)
			return err
		}
		fmt.Fprintf(out, "perms of file %q: %v\n", p, info.Mode().Perm())
		return nil
	})
	check(*owner, func(p string) error {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			fmt.Fprintf(out, "error from stat(%q): %v\n", p, err)
			return err
		}
		fmt.Fprintf(out, "owner UID of %q: %d\nowner GID of %q: %d\n", p, st.Uid, p, st.Gid)
		return nil
	})
	check(*content, func(p string) error { return printContent(out, p) })
	check(*loop, func(p string) error {
		return contentInLoop(out, p, time.Duration(*retry)*time.Second, *breakOnExpected, sleep)
	})
	if errors.Join(errs...) != nil {
		return 1
	}
	return 0
}

func printContent(out io.Writer, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(out, "error reading file content for %q: %v\n", path, err)
		return err
	}
	fmt.Fprintf(out, "content of file %q: %s\n", path, b)
	return nil
}

// contentInLoop prints path's content every 2 s for up to retry: the
// subPath suite starts a reader before the writer (a file that appears
// later, through another container's mount). It stops early once the
// content is the new-file content, if breakOnExpected, and returns the last
// read's error.
func contentInLoop(out io.Writer, path string, retry time.Duration, breakOnExpected bool, sleep func(time.Duration)) error {
	var err error
	for waited := time.Duration(0); waited < retry; waited += 2 * time.Second {
		if waited > 0 {
			sleep(2 * time.Second)
		}
		var b []byte
		if b, err = os.ReadFile(path); err != nil {
			fmt.Fprintf(out, "Error reading file %s: %v, retrying\n", path, err)
			continue
		}
		fmt.Fprintf(out, "content of file %q: %s\n", path, b)
		if !breakOnExpected {
			continue
		}
		if string(b) == newFileContent {
			return nil
		}
		fmt.Fprintf(out, "Unexpected content. Expected: %s. Retrying\n", newFileContent)
	}
	return err
}
