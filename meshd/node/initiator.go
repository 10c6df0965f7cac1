package node

import (
	"encoding/binary"

	"golang.org/x/crypto/blake2s"
	"golang.org/x/crypto/chacha20poly1305"
	"golang.org/x/crypto/curve25519"
	"golang.zx2c4.com/wireguard/device"
)

// initiator says which of candidates sent the handshake initiation pkt to
// the device holding priv, having checked that the sender holds that key's
// private half; ok is false for any other packet or sender.
//
// It repeats the first half of WireGuard's own check (Noise IK: the
// initiator's static key, sealed to ours, then the timestamp sealed under
// both static keys) so that meshd can act on a rotating peer's switch before
// WireGuard answers it: WireGuard tells no one which peer an initiation is
// from until the peer's data has already arrived.
func initiator[V any](pkt []byte, priv Key, candidates map[Key]V) (Key, bool) {
	if len(pkt) != device.MessageInitiationSize || binary.LittleEndian.Uint32(pkt) != device.MessageInitiationType {
		return Key{}, false
	}
	ephemeral := pkt[8:40]
	static := pkt[40 : 40+device.NoisePublicKeySize+chacha20poly1305.Overhead]
	timestamp := pkt[88 : 88+12+chacha20poly1305.Overhead]
	pub := priv.Public()

	var hash, chainKey, key [blake2s.Size]byte
	mixHash(&hash, &device.InitialHash, pub[:])
	mixHash(&hash, &hash, ephemeral)
	device.KDF1(&chainKey, device.InitialChainKey[:], ephemeral)
	ss, err := curve25519.X25519(priv[:], ephemeral)
	if err != nil {
		return Key{}, false
	}
	device.KDF2(&chainKey, &key, chainKey[:], ss)
	var from Key
	if !open(from[:0], key, static, hash[:]) {
		return Key{}, false
	}
	if _, ok := candidates[from]; !ok {
		return Key{}, false
	}
	mixHash(&hash, &hash, static)
	ss, err = curve25519.X25519(priv[:], from[:])
	if err != nil {
		return Key{}, false
	}
	device.KDF2(&chainKey, &key, chainKey[:], ss)
	if !open(nil, key, timestamp, hash[:]) {
		return Key{}, false
	}
	return from, true
}

func mixHash(dst, h *[blake2s.Size]byte, data []byte) {
	d, _ := blake2s.New256(nil)
	d.Write(h[:])
	d.Write(data)
	d.Sum(dst[:0])
}

func open(dst []byte, key [blake2s.Size]byte, sealed, ad []byte) bool {
	aead, err := chacha20poly1305.New(key[:])
	if err != nil {
		return false
	}
	var nonce [chacha20poly1305.NonceSize]byte
	_, err = aead.Open(dst, nonce[:], sealed, ad)
	return err == nil
}
